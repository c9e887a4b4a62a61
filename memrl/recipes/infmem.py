"""The InfMem vs MemAgent CPU demo (issue 45): per method, a tiny model trained from scratch, cold start on
the reading oracle through the method's workflow, then RL, evaluated on held-out synthetic one-fact tasks at
1x, 4x and 16x the training length (the 16x set with the asked fact early in the document, far from where
the reading ends).

  memrl demo --agent infmem --out runs/infmem/infmem/seed0 method=infmem
  memrl demo --agent infmem --out runs/infmem/memagent --seeds 0,1,2 method=memagent   # 3 training seeds
  python benchmarks/infmem_trained.py --trained runs/infmem                              # the trained table

`method` picks one arm of ARMS below (its workflow section; both train with GRPO, the reward std normalised):
infmem (plan -> retrieve or STOP -> memory -> ... -> final; GRPO on InfMem's mixed reward, memrl.rewards.
infmem) or memagent (one memory call per chunk, then the final; GRPO on the outcome).

`run_infmem_demo` chains the library's stages: the tasks (memrl.data.synthetic with the preset's
`data.synthetic`: SFT tasks at `sft.seed`, the held-out sets at `eval.seed`, written to
data/heldout_tasks.jsonl) -> init a tiny Qwen2 whose BPE tokenizer is trained on the task's text and both
arms' scripted contexts, so both methods share it (memrl.recipes.scratch.init_model) -> optional copy
warm-up (memrl.recipes.cold_start.copy_warmup) -> cold start: SFT on the reading oracle (memrl.demonstrators.
infmem.ReadingDemonstrator) played through the arm's workflow, every row as the workflow cuts it (memrl.demonstrators.
stages.context_demonstrations) -> held-out evaluation of the SFT model -> RL (preset infmem_cpu, on the
preset's synthetic task stream) -> the same evaluation after RL. The evaluation (memrl.recipes.summaries.
evaluate_by_bucket) is greedy and sampled (one sample per task at `eval.temperature`), per length, summarized by
`FIELDS`: accuracy (exact match) +- SE over tasks, model calls, chunks read, retrievals, tokens read, stop rate
and stop step. Writes results.json (memrl.recipes.pipeline.results; its facts: the lengths and the cold
start's statistics) and results.md.

Overrides: `key=value` for InfMemDemoConfig, `train.<key>=value` for the RL config (preset infmem_cpu);
`engine.*` and `workflow.*` are spelled as in `memrl train` (they set the RL config's sections, which the
cold start and evaluations use too; the arm's own workflow keys go first, so explicit ones win).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from memrl.config import MAX_COUNT, MAX_TOKENS, MAX_VOCAB, ConfigError, valid
from memrl.data.synthetic import at_length, corpus_text, make_tasks
from memrl.demonstrators.infmem import ReadingDemonstrator
from memrl.demonstrators.stages import context_demonstrations
from memrl.eval.fields import Field, accuracy, accuracy_se, mean, mean_of, share, summary_rows, tasks
from memrl.recipes.parts import (
    GRPO,
    SWEEP_METHOD,
    Arm,
    ArmRecipe,
    describe,
    engine_eval,
    workflow_section,
)
from memrl.recipes.pipeline import (
    EvalSettings,
    MethodSettings,
    ModelShape,
    RecipeConfig,
    RecipeRun,
    TaskSFTSettings,
    run_recipe,
)
from memrl.recipes.scratch import check_pieces, init_model
from memrl.recipes.summaries import evaluate_by_bucket, outcome
from memrl.recipes.tables import ACCURACY_SE, RunTable, SweepTable
from memrl.types import Task

__all__ = ["ARMS", "FIELDS", "Arm", "InfMemDemoConfig", "InfMemDemoEval", "InfMemDemoModel", "InfMemDemoSFT",
           "RECIPE", "heldout_tasks", "run_infmem_demo"]

ARMS: dict[str, Arm] = {
    "infmem": Arm({"name": "infmem",
                   "plan_template": "P: {problem}\nH: {history}\nM: {memory}\nPlan:",
                   "memory_template": "Q: {problem}\nH: {history}\nR: {retrieved}\nM: {memory}\nS:{chunk}",
                   "max_plan_tokens": 32, "retrieve_passage_tokens": 8, "retrieve_top_k": 1,
                   "plan_history_header": "{step}/{max_steps}", "memory_history_header": "{step}/{max_steps}",
                   "history_line": "{query}", "retrieved_item": "{text}", "no_retrieval_text": "none"}, GRPO),
    "memagent": Arm({"name": "memagent", "memory_template": "Q: {problem}\nM: {memory}\nS:{chunk}"}, GRPO),
}
"""`method` -> its arm. Short templates and history lines (a CPU model reads every prompt token); InfMem's
passages are one piece each (retrieve_passage_tokens = chunk_words), so a retrieval of the asked key returns
the piece that holds its fact. Both arms are GRPO with the reward std normalised: they differ in the
workflow and the reward only (InfMem's early-stop and protocol terms; MemAgent's outcome)."""


def stopped(row: Any) -> bool:
    """Whether a reading trajectory stopped early (the workflow's `stopped` metric)."""
    return bool(row["metrics"].get("stopped", 0.0))


FIELDS = (
    Field("accuracy", accuracy(1, outcome)), Field("accuracy_se", accuracy_se(1, outcome)),
    Field("model_calls", mean("model_calls")), Field("chunks_read", mean("memory_steps")),
    Field("chunks", mean("num_chunks")), Field("retrievals", mean("retrievals")), Field("tokens_read", mean("tokens_read")),
    Field("stop_rate", share(stopped)), Field("stop_step", mean_of(stopped, "stop_step")),
    Field("num_tasks", tasks(float)))
"""A MemAgent / InfMem evaluation's summary per length: accuracy (%, the exact-match `outcome`, whatever the
workflow's training reward mixes in) and its SE over tasks (each task's mean over its samples, ddof 1); per
trajectory the means of model calls, chunks read (memory calls), the document's chunks, retrievals and tokens
read (the workflows' metrics); the share that stopped early (%) and the mean stop step of those that did (0 when
none did); the number of tasks."""


@dataclass
class InfMemDemoModel(ModelShape):
    """The tiny Qwen2 trained from scratch (the MemAgent demo's "micro" shape by default)."""

    vocab_size: int = valid(2048, ge=300, le=MAX_VOCAB)
    """BPE target; the trained vocabulary stops earlier when the corpus runs out of merges."""
    max_positions: int = valid(512, ge=16, le=MAX_TOKENS)
    """Must hold the longest prompt plus its reply (the calls' prompts are one chunk and one memory, so
    they do not grow with the document)."""


@dataclass
class InfMemDemoSFT(TaskSFTSettings):
    """Cold start on the reading oracle (memrl.demonstrators.infmem) through the arm's workflow. The copy
    warm-up is off by default: the MemAgent demo's model learns to copy facts on this task without it."""

    num_tasks: int = valid(3000, ge=1, le=MAX_COUNT)
    """Training-length tasks to record demonstrations on (memagent: chunks + 1 rows each; infmem: 4 rows
    each, plan -> memory -> plan (STOP) -> final). 3000 x 2 epochs / 32: 750 steps (infmem), 1688 (memagent);
    the sizing is docs/guides/infmem_mem1.md's "The trained comparison"."""
    batch_rows: int = valid(32, ge=1, le=MAX_COUNT)


@dataclass
class InfMemDemoEval(EvalSettings):
    """Held-out evaluation, fixed before any run: the MemAgent demo's task seed (987654, used by no training
    split), greedy then one sample per task at `temperature`, at each multiple of the training length."""

    num_tasks: int = valid(100, ge=2, le=MAX_COUNT)
    """Tasks per length."""
    multipliers: list[int] = valid(default_factory=lambda: [1, 4, 16], ge=1, le=MAX_COUNT)
    """Lengths evaluated, as multiples of the training length (data.synthetic.num_chunks)."""
    far_multipliers: list[int] = valid(default_factory=lambda: [16], ge=1, le=MAX_COUNT)
    """At these multipliers the asked fact sits in the first `far_span` of the document (far from where the
    reading ends); each must be one of `multipliers`."""
    far_span: float = valid(0.25, gt=0, le=1)
    """The share of the document (from its start) that holds the asked fact at `far_multipliers`
    (SyntheticConfig.answer_span)."""


@dataclass
class InfMemDemoConfig(RecipeConfig):
    """`memrl demo --agent infmem` settings; the RL settings are the `infmem_cpu` preset (+ train.*)."""

    method: str = valid("infmem", choices=tuple(ARMS))
    model: InfMemDemoModel = field(default_factory=InfMemDemoModel)
    sft: InfMemDemoSFT = field(default_factory=InfMemDemoSFT)
    eval: InfMemDemoEval = field(default_factory=InfMemDemoEval)
    train_preset: str = "infmem_cpu"


def heldout_tasks(cfg: InfMemDemoConfig, syn: Any, path: Path) -> dict[int, list[Task]]:
    """({length in chunks: `eval.num_tasks` tasks at eval.seed}, one set per multiplier of the training length;
    at `eval.far_multipliers` the asked fact sits in the first `eval.far_span` of the document) written to
    `path` (one JSON line each, length-major)."""
    out = {}
    for m in cfg.eval.multipliers:
        shape = at_length(syn, syn.num_chunks * m)
        if m in cfg.eval.far_multipliers:
            shape = replace(shape, answer_span=cfg.eval.far_span)
        out[shape.num_chunks] = make_tasks(shape, cfg.eval.num_tasks, seed=cfg.eval.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"length": n, **asdict(t)}, sort_keys=True) for n, ts in out.items() for t in ts]
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return out


class InfMemRecipe(ArmRecipe):
    """The InfMem vs MemAgent demo as a recipe method (module docstring)."""

    name = "infmem"
    config = InfMemDemoConfig
    arms = ARMS
    settings = MethodSettings(
        seed_keys=(("seed", "demo"), ("sft.seed", "demo"), ("train.data.seed", "train"), ("train.trainer.seed", "train")),
        task_seeds=("sft.seed", "train.data.seed"), train_keys=("workflow", "algorithm.name", "data.synthetic.num_chunks"),
        sweep_extras=SWEEP_METHOD, demo_format="{model_calls:.2f} calls per task", demo_names_workflow=True)
    fields = FIELDS
    table = RunTable((("accuracy", ACCURACY_SE, "---"), ("model calls", "{model_calls:.2f}"),
                      ("chunks read", "{chunks_read:.2f}"), ("retrievals", "{retrievals:.2f}"),
                      ("stop rate", "{stop_rate:.0f}%"), ("stop step", "{stop_step:.2f}")),
                     (("SFT", "sft"), ("SFT + RL", "rl")), bucket="length (chunks)",
                     title="# InfMem demo: method={method} ({config[eval][num_tasks]} held-out tasks per length, "
                     "training length {train[data][synthetic][num_chunks]} chunks)",
                     notes=("Scripted oracle on its SFT tasks: accuracy {cold_start[summary][accuracy]:.1f}%, "
                            "{cold_start[summary][model_calls]:.2f} model calls, {cold_start[summary][chunks_read]:.2f} "
                            "chunks read.",), decoding_major=False)
    sweep = SweepTable((("accuracy (%)", "accuracy", 1), ("model calls", "model_calls", 2),
                        ("chunks read", "chunks_read", 2), ("retrievals", "retrievals", 2),
                        ("stop rate (%)", "stop_rate", 1)), bucket="length (chunks)", title="method {method}")

    def check(self, cfg: Any, train_overrides: list[str]) -> None:
        bad = [m for m in cfg.eval.far_multipliers if m not in cfg.eval.multipliers]
        if bad:
            raise ConfigError(f"eval.far_multipliers: {bad[0]} is not one of eval.multipliers {cfg.eval.multipliers}")

    def check_run(self, run: RecipeRun) -> None:
        super().check_run(run)
        tcfg, wf_cfg = run.tcfg, run.wf_cfg
        if tcfg.data.name != "synthetic":
            raise ConfigError(f"train.data.name must be synthetic (the demo's task), got {tcfg.data.name!r}")
        syn = tcfg.data.synthetic
        if syn.min_chunks or syn.bridge_fraction:
            raise ConfigError("train.data.synthetic: the demo needs fixed-length one-fact tasks (min_chunks 0, "
                              f"bridge_fraction 0), got min_chunks {syn.min_chunks}, bridge_fraction {syn.bridge_fraction}")
        if wf_cfg.chunk_tokens != syn.chunk_words:
            raise ConfigError(f"workflow.chunk_tokens {wf_cfg.chunk_tokens} must equal train.data.synthetic.chunk_words "
                              f"{syn.chunk_words} (a chunk is one piece)")

    def init(self, run: RecipeRun) -> None:
        cfg, tcfg, syn = run.cfg, run.tcfg, run.tcfg.data.synthetic
        sft_tasks = make_tasks(syn, cfg.sft.num_tasks, seed=cfg.sft.seed)
        heldout = heldout_tasks(cfg, syn, run.out / "data" / "heldout_tasks.jsonl")
        plays = [(name, c, ReadingDemonstrator.for_config(name, c, syn.fact_sep))  # both arms: one tokenizer
                 for name, c in ((n, workflow_section(tcfg, **a.workflow)) for n, a in ARMS.items())]
        run.tokenizer, run.model = init_model(
            run.out, cfg.model.preset(), cfg.model.vocab_size, cfg.seed, lambda e: corpus_text(seed=cfg.seed, extra=e),
            play=lambda tok: [g for n, c, a in plays for g in context_demonstrations(sft_tasks[:60], tok, n, c, a)],
            chat=False)
        check_pieces(run.tokenizer, sft_tasks[0], syn.chunk_words)
        describe(run)
        run.extra.update(sft_tasks=sft_tasks, heldout=heldout)
        run.facts["lengths"] = list(heldout)

    def play(self, run: RecipeRun) -> list[Any]:
        """The reading oracle through the arm's workflow (memagent: one memory row per chunk + the final;
        infmem: plan, memory, ..., the final), every row as the workflow cuts it."""
        oracle = ReadingDemonstrator.for_config(run.spec.name, run.wf_cfg, run.tcfg.data.synthetic.fact_sep)
        return context_demonstrations(run.extra["sft_tasks"], run.tokenizer, run.spec.name, run.wf_cfg, oracle)

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> Any:
        print("SFT, held-out:" if policy == "sft" else "SFT+RL, held-out:")
        rows = engine_eval(evaluate_by_bucket, run, model, model_dir, run.extra["heldout"], policy=policy)
        summary = summary_rows(rows, self.fields)
        for length in run.extra["heldout"]:
            print(f"  {length} chunks: " + ", ".join(f"{s['decoding']} {s['accuracy']:.1f} ± {s['accuracy_se']:.1f}%, "
                                                     f"{s['model_calls']:.1f} calls" for s in summary
                                                     if s["bucket"] == str(length)))
        return rows


RECIPE = InfMemRecipe()
run_infmem_demo = partial(run_recipe, RECIPE)
"""Run the whole demo for one arm (module docstring): (out_dir, overrides) -> what results.json holds."""
