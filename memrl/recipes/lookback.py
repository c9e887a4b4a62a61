"""MemAgent vs ReMemR1 on the look-back synthetic task (memrl.data.synthetic_lookback), on CPU, as a recipe method
(issue 60): same tokenizer, model init, cold start and RL budget for both arms.

  memrl demo --agent lookback --out runs/lookback/rememr1 method=rememr1
  memrl demo --agent lookback --out runs/lookback/memagent --seeds 0,1,2 method=memagent
  python benchmarks/lookback_compare.py --out runs/lb3 --seeds 0,1,2 [overrides]   # both arms, the gaps

`method` picks the arm: its RL preset (lookback_memagent_cpu: GRPO; lookback_rememr1_cpu: the multi-level
advantage), whose workflow section the arm's evaluations use too. The stages (memrl.recipes.pipeline):
tasks (RL tasks of 4 pieces, data/train.json, read by RL as data.name=file; SFT tasks of `sft.chunks`
pieces; `eval.num_tasks` held-out tasks per length N of `eval.lengths`, seeded eval.seed + N,
data/eval_<N>.json) -> a random tiny Qwen2 whose tokenizer is trained on the task's words and both arms'
prompt formats (model/) -> the scripted oracle's held-out numbers (memrl.demonstrators.LookbackDemonstrator:
`oracle`) -> optional copy warm-up -> cold start on the oracle's traces of BOTH workflows (recall steps
repeated `sft.oversample_recall` times) -> held-out evaluation -> RL -> the same evaluation, ReMemR1 also
with recall disabled (workflow.recall=false: `rl_norecall`, the ablation). The cold start depends on no
arm setting, so both arms' cold starts are the same checkpoint (the one-checkpoint design of the old
benchmark, now by construction). Evaluations: memrl.eval.runner per policy (out/eval/<policy>[_sampled]),
greedy and (eval.sampled) one sample per task at eval.temperature (1), eval seed 0; per length: accuracy (%) +- s.e.
over tasks, recall rate (recalls / memory steps), callback hit rate (hits / recalls; None without recalls),
format errors per step, and the same pooled over lengths (bucket "all").

Training seed k (`seed`, shifted by `--seeds`) shifts the tokenizer corpus and BPE, the model init, the copy
warm-up, the SFT order and, by 2k, the task streams (RL tasks rl_task_seed + 2k, SFT tasks sft.task_seed +
2k: the old benchmark's 1 + 2k and 2 + 2k); `--seeds` shifts train.data.seed and train.trainer.seed by k.
`old_defaults` (on) runs RL with engine.hf.kv_cache=padded and trainer.prefix_sharing=never and the
evaluations with kv_cache=padded, as docs/results/rememr1.md's tables were recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from memrl.config import MAX_COUNT, MAX_LR, MAX_PARALLEL, MAX_SEED, ConfigError, load_config, valid
from memrl.data.io import load_tasks
from memrl.data.memagent_files import write_eval_json
from memrl.data.synthetic import corpus_text
from memrl.data.synthetic_lookback import LookbackConfig as Shape
from memrl.data.synthetic_lookback import corpus_extra, make_lookback_tasks
from memrl.demonstrators import LookbackDemonstrator, ScriptedEngine, play_scripted
from memrl.engines import EngineConfig, HFSection
from memrl.eval import fields
from memrl.eval.fields import Field
from memrl.eval.runner import EvalConfig, evaluate
from memrl.models.tiny import PRESETS as MODEL_PRESETS
from memrl.models.tiny import ModelPreset, init_tiny_model
from memrl.recipes.parts import SWEEP_METHOD
from memrl.recipes.pipeline import (
    EvalSettings,
    MethodSettings,
    Recipe,
    RecipeConfig,
    RecipeRun,
    WarmupSFTSettings,
    need_workflow,
    overridden,
    run_recipe,
)
from memrl.recipes.tables import GridTable, mean_se
from memrl.training.config import TrainConfig
from memrl.types import Segment
from memrl.workflows import parse_workflow

__all__ = ["FIELDS", "OLD_DEFAULTS", "PRESETS", "RECIPE", "LookbackConfig", "LookbackEval", "LookbackSFT",
           "run_lookback_demo"]

PRESETS = {"memagent": "lookback_memagent_cpu", "rememr1": "lookback_rememr1_cpu"}
"""`method` -> its RL preset (workflow, algorithm, RL budget)."""
OLD_DEFAULTS = ("engine.hf.kv_cache=padded", "trainer.prefix_sharing=never")
"""The defaults before 2026-11-28, with which docs/results/rememr1.md's tables were recorded (`old_defaults`)."""
SHAPE = dict(chunk_words=8, facts_per_chunk=1, num_keys=16, num_values=8, fact_position="start")
"""The look-back tasks' shape (memrl.data.synthetic_lookback.LookbackConfig) for training and evaluation."""
RL_CHUNKS = 4
"""Pieces per RL task."""
POLICIES = ("oracle", "sft", "rl", "rl_norecall")
"""The evaluated policies, in table order (oracle: the scripted reference; rl_norecall: ReMemR1 only)."""


@dataclass
class LookbackSFT(WarmupSFTSettings):
    """Cold start on the scripted oracle's traces of both workflows, with the copy warm-up's own rows and lr."""

    num_tasks: int = valid(500, ge=1, le=MAX_COUNT)
    """SFT tasks (each played through both workflows)."""
    chunks: int = valid(4, ge=1, le=MAX_COUNT)
    """Pieces per SFT task."""
    task_seed: int = valid(2, ge=0, le=MAX_SEED)
    """Seed of the SFT tasks at training seed 0 (training seed k: task_seed + 2k)."""
    oversample_recall: int = valid(1, ge=1, le=MAX_COUNT)
    """Repeat each demonstrated recall step this many times (recalls are ~6% of the rows)."""
    epochs: int = valid(2, ge=1, le=MAX_COUNT)
    lr: float = valid(3e-3, gt=0, le=MAX_LR)
    batch_rows: int = valid(32, ge=1, le=MAX_COUNT)
    copy_warmup_rows: int = valid(32, ge=0, le=MAX_COUNT, note="0 = 4 x batch_rows")
    copy_warmup_lr: float = valid(1e-3, gt=0, le=MAX_LR)
    """The copy warm-up's learning rate (the cold start's is `lr`)."""


@dataclass
class LookbackEval(EvalSettings):
    """Held-out tasks per length N, seeded eval.seed + N (the same for every training seed)."""

    num_tasks: int = valid(48, ge=1, le=MAX_COUNT)
    seed: int = valid(1000, ge=0, le=MAX_SEED)
    """Held-out tasks of length N use seed + N (1000: the held-out tasks; tune on another, e.g. 5000)."""
    lengths: list[int] = valid(default_factory=lambda: [2, 4, 8, 16], ge=1, le=MAX_COUNT)
    """Pieces per held-out task, one set per length."""
    sampled: bool = True
    """Also evaluate one sample per task at `temperature` (evaluation seed 0)."""
    oracle: bool = True
    """Evaluate the arm's scripted oracle (the reference policy `oracle`)."""


@dataclass
class LookbackConfig(RecipeConfig):
    """`memrl demo --agent lookback` settings; the RL settings are the arm's preset (+ train.*)."""

    method: str = valid("rememr1", choices=tuple(PRESETS))
    """The arm: memagent (preset lookback_memagent_cpu, GRPO) or rememr1 (lookback_rememr1_cpu)."""
    sft: LookbackSFT = field(default_factory=LookbackSFT)
    eval: LookbackEval = field(default_factory=LookbackEval)
    rl_tasks: int = valid(2000, ge=1, le=MAX_COUNT)
    """RL tasks (4 pieces each)."""
    rl_task_seed: int = valid(1, ge=0, le=MAX_SEED)
    """Seed of the RL tasks at training seed 0 (training seed k: rl_task_seed + 2k)."""
    seed: int = valid(0, ge=0, le=MAX_SEED)
    """Training seed: tokenizer corpus and BPE, model init, copy warm-up, SFT order; shifts the task streams."""
    old_defaults: bool = True
    """engine.hf.kv_cache=padded and trainer.prefix_sharing=never (docs/results/rememr1.md's tables)."""
    train_preset: str = ""
    """The RL preset; empty = the arm's (PRESETS)."""
    threads: int = valid(1, ge=0, le=MAX_PARALLEL, note="0 = torch's default")
    """torch's threads for the whole run (1: the recorded tables')."""

    def __post_init__(self) -> None:
        self.train_preset = self.train_preset or PRESETS.get(self.method, "")

    def policy_shape(self) -> ModelPreset:
        """The model the first stage builds (memrl.recipes.policy): memrl.models.tiny's "tiny" (`init`)."""
        return MODEL_PRESETS["tiny"]


def streams(cfg: LookbackConfig) -> dict[str, int]:
    """The task-stream seeds of the run: RL tasks and SFT tasks."""
    return {"rl": cfg.rl_task_seed + 2 * cfg.seed, "sft": cfg.sft.task_seed + 2 * cfg.seed}


def preset_workflow(wf: str, **extra: Any) -> Any:
    """The parsed workflow config of arm `wf`'s preset (with `extra` fields)."""
    section = dict(load_config(TrainConfig, ["model.path=x", "data.path=x"], preset=PRESETS[wf]).workflow)
    return parse_workflow({**section, **extra})[1]


def write_tasks(path: Path, pieces: int, num: int, seed: int, **meta: Any) -> None:
    """`num` look-back tasks of `pieces` pieces (SHAPE) from `seed`, `meta` in each one's meta, to `path`."""
    tasks = make_lookback_tasks(Shape(num_chunks=pieces, **SHAPE), num, seed=seed)
    for t in tasks:
        t.meta.update(meta)
    write_eval_json(path, tasks)


def oracle(wf: str, c: Any, tokenizer: Any) -> ScriptedEngine:
    """Arm `wf`'s scripted oracle (workflow config `c`) as an engine."""
    return ScriptedEngine(LookbackDemonstrator.for_config(wf, c), tokenizer=tokenizer)


def heldout_eval(run: RecipeRun, name: str, model_dir: Path | None, *, sampled: bool = False,
                 recall: bool = True) -> list[dict[str, Any]]:
    """memrl.eval.runner on the held-out files: `model_dir`'s policy (None: the arm's scripted oracle), its
    results in out/eval/<name>[_sampled]; returns their rows (`rows`)."""
    wf, cfg, c = run.cfg.method, run.cfg, preset_workflow(run.cfg.method)
    res, tdir = run.out / "eval" / (name + ("_sampled" if sampled else "")), run.out / "templates" / wf
    tdir.mkdir(parents=True, exist_ok=True)
    for kind, t in zip(("memory", "final"), c.templates(), strict=True):
        # a template file's text is used exactly (template_strip=false): the prompt text, no final newline
        (tdir / f"{kind}.txt").write_text(t.text, encoding="utf-8", newline="")
    keep = ("chunk_tokens", "max_memory_tokens", "max_final_tokens", "scorer")
    section = {"name": wf, **{k: getattr(c, k) for k in keep if hasattr(c, k)},
               "memory_template_file": str(tdir / "memory.txt"), "final_template_file": str(tdir / "final.txt"),
               **({"temperature": cfg.eval.temperature} if sampled else {}), **({} if recall else {"recall": False})}
    hf = HFSection(kv_cache="padded") if cfg.old_defaults else HFSection()
    ecfg = EvalConfig(workflow=section, engine=EngineConfig(model=str(model_dir or "oracle"), max_batch_size=256,
                                                            hf=hf), concurrency=256, name=res.name, progress=False)
    evaluate([str(run.out / "data" / f"eval_{n}.json") for n in cfg.eval.lengths], res, ecfg,
             engine=None if model_dir else oracle(wf, c, run.tokenizer))
    return rows(res, name)


def rows(res_dir: Path, policy: str) -> list[dict[str, Any]]:
    """The evaluation rows of memrl.eval.runner's results.jsonl in `res_dir`, by length (stable), their policy
    column `policy` (the runner's is the folder's name, "<policy>_sampled" for the sampled one)."""
    got = [json.loads(x) for x in (res_dir / "results.jsonl").read_text().splitlines() if x.strip()]
    return [{**r, "policy": policy} for r in sorted(got, key=lambda r: int(r["num_docs"]))]


def _sum(metric: str) -> Any:
    return lambda rs: sum(r["metrics"].get(metric, 0) for r in rs)


def _rate(num: str, den: str, none: float | None) -> Any:
    def reduce(rs: list[dict[str, Any]]) -> float | None:
        d = _sum(den)(rs)
        return _sum(num)(rs) / d if d else none
    return reduce


EM = lambda r: r["em"]  # noqa: E731 - the runner's exact match column
FIELDS = (Field("n", fields.tasks()), Field("accuracy", fields.accuracy(0, EM)), Field("se", fields.accuracy_se(0, EM)),
          Field("steps", _sum("num_chunks")), Field("recalls", _sum("recalls")), Field("hits", _sum("callback_hits")),
          Field("recall_rate", _rate("recalls", "num_chunks", 0.0)),
          Field("callback_hit_rate", _rate("callback_hits", "recalls", None)),
          Field("format_errors", lambda rs: _sum("format_errors")(rs) / max(_sum("num_chunks")(rs), 1)))
"""Per policy, decoding and length N (and "all", pooled): n tasks, accuracy (%) and its binomial s.e.
(sqrt(p (1 - p) / n), one sample per task), memory steps, recalls, callback hits, recall rate (recalls /
steps; 0.0 without steps), callback hit rate (hits / recalls; None without recalls), format errors per memory
step."""


GRID = GridTable(mean_se("accuracy", "se"), "accuracy", (("recall rate", "recall_rate", 3),
                                                            ("callback hit rate", "callback_hit_rate", 3)),
                 bucket="N={}", buckets="config.eval.lengths", title="method {method} (accuracy % ± s.e. over tasks)",
                 sweep_title="method {method} (accuracy %)", policies=tuple((p, p) for p in POLICIES))
"""The look-back tables: per decoding a row per policy, accuracy per length N, the pooled recall rates."""


class LookbackRecipe(Recipe):
    """The look-back comparison as a recipe method (module docstring)."""

    name = "lookback"
    config = LookbackConfig
    settings = MethodSettings(seed_keys=(("seed", "demo"), ("train.data.seed", "train"), ("train.trainer.seed", "train")),
                              heldout_per="lengths",  # length N: eval.seed + N, data/eval_<N>.json
                              pooled=True, sweep_extras=SWEEP_METHOD, save_warmup=False)
    fields = FIELDS
    table, sweep = GRID, GRID.sweep()

    def check(self, cfg: LookbackConfig, train_overrides: list[str]) -> None:
        if wf := overridden(train_overrides, "workflow"):
            raise ConfigError(f"{wf!r}: the arms' workflows are their presets' (the shared cold start plays "
                              "both); not overridable")

    def training_task_seeds(self, cfg: LookbackConfig) -> dict[str, int]:
        return {f"seed {cfg.seed}: the {k} task seed": v for k, v in streams(cfg).items()}

    def train_overrides(self, cfg: LookbackConfig, out_dir: str | Path) -> list[str]:
        return ["data.name=file", f"data.path={Path(out_dir) / 'data' / 'train.json'}", "trainer.progress=false",
                *(OLD_DEFAULTS if cfg.old_defaults else ())]

    def check_run(self, run: RecipeRun) -> None:
        need_workflow(run, run.cfg.method, f" (the arm's; train_preset {run.cfg.train_preset})")

    def init(self, run: RecipeRun) -> None:
        cfg, d, seeds = run.cfg, run.out / "data", streams(run.cfg)
        d.mkdir(parents=True, exist_ok=True)
        write_tasks(d / "train.json", RL_CHUNKS, cfg.rl_tasks, seeds["rl"])
        write_tasks(d / "sft.json", cfg.sft.chunks, cfg.sft.num_tasks, seeds["sft"])
        for n in cfg.eval.lengths:
            write_tasks(d / f"eval_{n}.json", n, cfg.eval.num_tasks, cfg.eval.seed + n, num_docs=n)
        tpls = [t.text for wf in PRESETS for t in preset_workflow(wf).templates()]
        corpus = run.out / "corpus.txt"
        corpus.write_text(corpus_text(seed=cfg.seed, extra=corpus_extra(tuple(tpls))), encoding="utf-8")
        init_tiny_model(run.out / "model", "tiny", corpus=[corpus], vocab_size=2048, seed=cfg.seed)
        run.tokenizer = AutoTokenizer.from_pretrained(run.out / "model")
        run.model = AutoModelForCausalLM.from_pretrained(run.out / "model", dtype=torch.float32)
        run.extra["sft_tasks"] = load_tasks(d / "sft.json")
        run.facts["streams"] = seeds

    def scripted(self, run: RecipeRun) -> list[dict[str, Any]]:
        return heldout_eval(run, "oracle", None) if run.cfg.eval.oracle else []

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], dict[str, Any]]:
        """The oracle's traces of BOTH workflows (whatever the arm), recall steps repeated."""
        rows_all: list[Segment] = []
        stats, k = {}, run.cfg.sft.oversample_recall
        for wf in PRESETS:
            c = preset_workflow(wf, temperature=0.0)
            rule = LookbackDemonstrator.for_config(wf, c)
            groups = play_scripted(rule, run.extra["sft_tasks"], run.tokenizer, wf, c)
            rows = [x for g in groups for x in g.segments()]
            recalls = [x for x in rows if x.info.get("recall_query")]
            rows_all += rows + recalls * (k - 1)
            stats[wf] = {"rows": len(rows) + len(recalls) * (k - 1), "recall_steps": len(recalls),
                         "accuracy": 100 * sum(g.rewards[0] for g in groups) / len(groups)}
            print(f"sft traces {wf}: {stats[wf]['rows']} rows ({len(recalls)} recall steps x{k}), demonstrator "
                  f"accuracy {stats[wf]['accuracy']:.1f}%", flush=True)
        return rows_all, stats

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> list[dict[str, Any]]:
        """Greedy (and sampled) rows of `policy`; after RL, ReMemR1's with recall off too (policy rl_norecall: the
        ablation, queries retrieve nothing)."""
        modes = ("greedy", "sampled") if run.cfg.eval.sampled else ("greedy",)
        out = [r for m in modes for r in heldout_eval(run, policy, Path(model_dir), sampled=m == "sampled")]
        if policy == "rl" and run.cfg.method == "rememr1":
            out += [r for m in modes for r in heldout_eval(run, "rl_norecall", Path(model_dir),
                                                          sampled=m == "sampled", recall=False)]
        return out


RECIPE = LookbackRecipe()
run_lookback_demo = partial(run_recipe, RECIPE)
"""Run one arm (module docstring): (out_dir, overrides) -> what results.json holds."""
