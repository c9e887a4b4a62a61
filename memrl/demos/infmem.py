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
arms' scripted contexts, so both methods share it (memrl.demos.scratch.init_reading_model) -> optional copy
warm-up (memrl.demos.cold_start.copy_warmup) -> cold start: SFT on the reading oracle (memrl.demonstrators.
infmem.ReadingOracle) played through the arm's workflow, every row as the workflow cuts it (memrl.demos.
cold_start.reading_cold_start) -> held-out evaluation of the SFT model -> RL (preset infmem_cpu, on the
preset's synthetic task stream) -> the same evaluation after RL. The evaluation (memrl.eval.evaluator.
evaluate_reading) is greedy and sampled (one sample per task at `eval.temperature`), per length: accuracy
(exact match) +- SE over tasks, model calls, chunks read, retrievals, tokens read, stop rate and stop step.
Writes results.json and results.md.

Overrides: `key=value` for InfMemDemoConfig, `train.<key>=value` for the RL config (preset infmem_cpu);
`engine.*` and `workflow.*` are spelled as in `memrl train` (they set the RL config's sections, which the
cold start and evaluations use too; the arm's own workflow keys go first, so explicit ones win).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from memrl.config import (
    MAX_COUNT,
    MAX_LR,
    MAX_PARALLEL,
    MAX_SEED,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    MAX_VOCAB,
    ConfigError,
    load_config,
    to_yaml,
    valid,
)
from memrl.data.synthetic import at_length, make_tasks
from memrl.demonstrators.infmem import ReadingOracle
from memrl.demos import split_overrides
from memrl.demos.cold_start import copy_warmup as copy_warmup_stage
from memrl.demos.cold_start import reading_cold_start
from memrl.demos.scratch import init_reading_model
from memrl.eval.evaluator import EngineRollout, evaluate_reading, model_engine
from memrl.models.tiny import ModelPreset, shape_problem
from memrl.training.assemble import assemble, check_writable, validate
from memrl.training.checkpoint import latest_checkpoint
from memrl.training.config import TrainConfig
from memrl.training.sft import SFTConfig
from memrl.training.trainer import Trainer
from memrl.types import Task
from memrl.workflows import parse_workflow

__all__ = ["ARMS", "Arm", "InfMemDemoConfig", "InfMemDemoEval", "InfMemDemoModel", "InfMemDemoSFT",
           "heldout_tasks", "load_configs", "results_markdown", "run_infmem_demo"]


@dataclass(frozen=True)
class Arm:
    """One method of the comparison: its workflow section (merged over the preset's) and its RL overrides."""

    workflow: dict[str, Any]
    algorithm: tuple[str, ...]


_GRPO = ("algorithm.name=grpo", "algorithm.grpo.norm_by_std=true")
ARMS: dict[str, Arm] = {
    "infmem": Arm({"name": "infmem",
                   "plan_template": "P: {problem}\nH: {history}\nM: {memory}\nPlan:",
                   "memory_template": "Q: {problem}\nH: {history}\nR: {retrieved}\nM: {memory}\nS:{chunk}",
                   "max_plan_tokens": 32, "retrieve_passage_tokens": 8, "retrieve_top_k": 1,
                   "plan_history_header": "{step}/{max_steps}", "memory_history_header": "{step}/{max_steps}",
                   "history_line": "{query}", "retrieved_item": "{text}", "no_retrieval_text": "none"}, _GRPO),
    "memagent": Arm({"name": "memagent", "memory_template": "Q: {problem}\nM: {memory}\nS:{chunk}"}, _GRPO),
}
"""`method` -> its arm. Short templates and history lines (a CPU model reads every prompt token); InfMem's
passages are one piece each (retrieve_passage_tokens = chunk_words), so a retrieval of the asked key returns
the piece that holds its fact. Both arms are GRPO with the reward std normalised: they differ in the
workflow and the reward only (InfMem's early-stop and protocol terms; MemAgent's outcome)."""


@dataclass
class InfMemDemoModel:
    """The tiny Qwen2 trained from scratch (the MemAgent demo's "micro" shape by default)."""

    hidden_size: int = valid(128, ge=1, le=65536)
    num_layers: int = valid(4, ge=1, le=1024)
    num_heads: int = valid(4, ge=1, le=1024)
    num_kv_heads: int = valid(2, ge=1, le="num_heads")
    vocab_size: int = valid(2048, ge=300, le=MAX_VOCAB)
    """BPE target; the trained vocabulary stops earlier when the corpus runs out of merges."""
    max_positions: int = valid(512, ge=16, le=MAX_TOKENS)
    """Must hold the longest prompt plus its reply (the calls' prompts are one chunk and one memory, so
    they do not grow with the document)."""

    def __post_init__(self) -> None:
        problem = shape_problem(self.hidden_size, self.num_heads, self.num_kv_heads, "model.")
        if problem:
            raise ValueError(problem)


@dataclass
class InfMemDemoSFT:
    """Cold start on the reading oracle (memrl.demonstrators.infmem) through the arm's workflow."""

    num_tasks: int = valid(3000, ge=1, le=MAX_COUNT)
    """Training-length tasks to record demonstrations on (memagent: chunks + 1 rows each; infmem: 4 rows
    each, plan -> memory -> plan (STOP) -> final). 3000 x 2 epochs / 32: 750 steps (infmem), 1688 (memagent);
    the sizing is docs/guides/infmem_mem1.md's "The trained comparison"."""
    seed: int = valid(500, ge=0, le=MAX_SEED)
    """Seed of the demonstration tasks."""
    copy_warmup_steps: int = valid(0, ge=0, le=MAX_COUNT, note="0 = off")
    """Copy warm-up steps before the cold start (memrl.demos.cold_start.copy_warmup). Off: the MemAgent demo's
    model learns to copy facts on this task without it."""
    copy_warmup_rows: int = valid(0, ge=0, le=MAX_COUNT, note="0 = 4 x batch_rows")
    epochs: int = valid(2, ge=1, le=MAX_COUNT)
    lr: float = valid(1e-3, gt=0, le=MAX_LR)
    batch_rows: int = valid(32, ge=1, le=MAX_COUNT)
    warmup_steps: int = valid(20, ge=0, le=MAX_COUNT)


@dataclass
class InfMemDemoEval:
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
    seed: int = valid(987654, ge=0, le=MAX_SEED)
    temperature: float = valid(1.0, gt=0, le=MAX_TEMPERATURE)


@dataclass
class InfMemDemoConfig:
    """`memrl demo --agent infmem` settings; the RL settings are the `infmem_cpu` preset (+ train.*)."""

    method: str = valid("infmem", choices=tuple(ARMS))
    model: InfMemDemoModel = field(default_factory=InfMemDemoModel)
    sft: InfMemDemoSFT = field(default_factory=InfMemDemoSFT)
    eval: InfMemDemoEval = field(default_factory=InfMemDemoEval)
    seed: int = valid(0, ge=0, le=MAX_SEED)
    """Seed of the tokenizer, the model's initial weights, the copy warm-up and the SFT order."""
    train_preset: str = "infmem_cpu"
    threads: int = valid(0, ge=0, le=MAX_PARALLEL, note="0 = torch's default")


def load_configs(overrides: list[str], out_dir: str | Path) -> tuple[InfMemDemoConfig, Any, Path, Arm]:
    """(demo config, RL config, writable output dir, arm); fails on a bad value before any work."""
    demo_ov, train_ov = split_overrides(list(overrides))
    cfg = load_config(InfMemDemoConfig, demo_ov)
    if cfg.method not in ARMS:
        raise ConfigError(f"method must be one of {', '.join(ARMS)}, got {cfg.method!r}")
    bad = [m for m in cfg.eval.far_multipliers if m not in cfg.eval.multipliers]
    if bad:
        raise ConfigError(f"eval.far_multipliers: {bad[0]} is not one of eval.multipliers {cfg.eval.multipliers}")
    arm = ARMS[cfg.method]
    out = check_writable(out_dir, "--out")
    arm_ov = [f"workflow={arm.workflow['name']}",
              *[f"workflow.{k}={json.dumps(v)}" for k, v in arm.workflow.items() if k != "name"], *arm.algorithm]
    tcfg = load_config(TrainConfig, [f"model.path={out / 'sft'}", f"out_dir={out / 'rl'}", *arm_ov, *train_ov],
                       preset=cfg.train_preset)
    spec, wf_cfg = validate(tcfg)
    if spec.name != arm.workflow["name"]:
        raise ConfigError(f"workflow.name must be {arm.workflow['name']} for method={cfg.method}, got {spec.name!r}")
    if tcfg.data.name != "synthetic":
        raise ConfigError(f"train.data.name must be synthetic (the demo's task), got {tcfg.data.name!r}")
    syn = tcfg.data.synthetic
    if syn.min_chunks or syn.bridge_fraction:
        raise ConfigError("train.data.synthetic: the demo needs fixed-length one-fact tasks (min_chunks 0, "
                          f"bridge_fraction 0), got min_chunks {syn.min_chunks}, bridge_fraction {syn.bridge_fraction}")
    if wf_cfg.chunk_tokens != syn.chunk_words:
        raise ConfigError(f"workflow.chunk_tokens {wf_cfg.chunk_tokens} must equal train.data.synthetic.chunk_words "
                          f"{syn.chunk_words} (a chunk is one piece)")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return cfg, tcfg, out, arm


def _section(tcfg: Any, arm: Arm) -> Any:
    """The workflow config of `arm`, its other fields from the RL config's workflow section where that
    workflow has them (the tokenizer plays both arms)."""
    return parse_workflow(arm.workflow, defaults=dict(tcfg.workflow))[1]


def model_shape(cfg: InfMemDemoConfig) -> ModelPreset:
    m = cfg.model
    return ModelPreset(m.vocab_size, m.hidden_size, 2 * m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads,
                       max_position_embeddings=m.max_positions)


def heldout_tasks(cfg: InfMemDemoConfig, syn: Any) -> dict[int, list[Task]]:
    """{length in chunks: `eval.num_tasks` tasks at eval.seed}, one set per multiplier of the training length;
    at `eval.far_multipliers` the asked fact sits in the first `eval.far_span` of the document."""
    out = {}
    for m in cfg.eval.multipliers:
        shape = at_length(syn, syn.num_chunks * m)
        if m in cfg.eval.far_multipliers:
            shape = replace(shape, answer_span=cfg.eval.far_span)
        out[shape.num_chunks] = make_tasks(shape, cfg.eval.num_tasks, seed=cfg.eval.seed)
    return out


def write_heldout(tasks: dict[int, list[Task]], path: Path) -> str:
    """Write the held-out tasks (one JSON line each, length-major) to `path`; returns its SHA-256 (what the
    seed sweep checks every run evaluated)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"length": n, **asdict(t)}, sort_keys=True) for n, ts in tasks.items() for t in ts]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def evaluate(model: Any, tokenizer: Any, spec: Any, wf_cfg: Any, tasks: dict[int, list[Task]], temperature: float,
             seed: int, engine_cfg: Any, model_dir: str | Path = "") -> dict[str, dict[str, dict[str, float]]]:
    """{length: {"greedy": summary, "sampled": summary}} on the held-out tasks (memrl.eval.evaluator.
    evaluate_reading)."""
    with model_engine(model, tokenizer, engine_cfg, model_dir) as engine:
        return evaluate_reading(EngineRollout(engine, spec), wf_cfg, tasks, temperature, seed)


def results_markdown(results: dict[str, Any]) -> str:
    """The run's table: one row per policy, decoding and length."""
    lines = [f"# InfMem demo: method={results['method']} ({results['eval_tasks']} held-out tasks per length, "
             f"training length {results['train_chunks']} chunks)", "",
             "| policy | decoding | length (chunks) | accuracy | model calls | chunks read | retrievals | stop rate "
             "| stop step |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for policy, label in (("sft", "SFT"), ("rl", "SFT + RL")):
        for length, modes in results[policy].items():
            for mode, r in modes.items():
                lines.append(f"| {label} | {mode} | {length} | {r['accuracy']:.1f} +- {r['accuracy_se']:.1f} "
                             f"| {r['model_calls']:.2f} | {r['chunks_read']:.2f} | {r['retrievals']:.2f} "
                             f"| {r['stop_rate']:.0f}% | {r['stop_step']:.2f} |")
    s = results["scripted"]
    lines += ["", f"Scripted oracle on its SFT tasks: accuracy {s['accuracy']:.1f}%, {s['model_calls']:.2f} model "
              f"calls, {s['chunks_read']:.2f} chunks read."]
    return "\n".join(lines) + "\n"


def run_infmem_demo(out_dir: str | Path, overrides: list[str]) -> dict[str, Any]:
    """Run the whole demo for one arm (module docstring); returns what results.json holds."""
    t_start = time.perf_counter()
    cfg, tcfg, out, arm = load_configs(overrides, out_dir)
    (out / "demo_config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    timings: dict[str, float] = {}
    spec, wf_cfg = validate(tcfg)
    syn = tcfg.data.synthetic

    t0 = time.perf_counter()
    sft_tasks = make_tasks(syn, cfg.sft.num_tasks, seed=cfg.sft.seed)
    heldout = heldout_tasks(cfg, syn)
    digest = write_heldout(heldout, out / "data" / "heldout_tasks.jsonl")
    plays = []
    for name, a in ARMS.items():  # both arms' contexts: the same tokenizer whatever the method
        c = _section(tcfg, a)
        plays.append((name, c, ReadingOracle.for_config(name, c, syn.fact_sep)))
    tokenizer, model = init_reading_model(out, syn, plays, sft_tasks, model_shape(cfg), cfg.model.vocab_size,
                                          cfg.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"method {cfg.method}: workflow {spec.name}, {tcfg.algorithm.name}; model {n_params / 1e6:.2f}M "
          f"parameters, vocabulary {len(tokenizer)}")
    timings["init_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    s = cfg.sft
    warmup = (copy_warmup_stage(model, tokenizer, s.copy_warmup_steps, s.copy_warmup_rows or 4 * s.batch_rows, s.lr,
                                cfg.seed, out / "copy_warmup", progress=tcfg.trainer.progress)
              if s.copy_warmup_steps else [])
    timings["copy_warmup_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    scfg = SFTConfig(epochs=s.epochs, batch_rows=s.batch_rows, lr=s.lr, warmup_steps=s.warmup_steps, seed=cfg.seed)
    oracle = ReadingOracle.for_config(spec.name, wf_cfg, syn.fact_sep)
    sft_losses, demo = reading_cold_start(model, tokenizer, sft_tasks, spec.name, wf_cfg, oracle, scfg, out / "sft",
                                          progress=tcfg.trainer.progress)
    timings["sft_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    print("SFT, held-out:")
    sft_eval = evaluate(model, tokenizer, spec, wf_cfg, heldout, cfg.eval.temperature, cfg.eval.seed, tcfg.engine,
                        out / "sft")
    timings["eval_sft_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    trainer = Trainer(assemble(tcfg, workflow=(spec, wf_cfg)))
    history = trainer.fit()
    timings["rl_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    print("SFT+RL, held-out:")
    rl_eval = evaluate(trainer.model, tokenizer, spec, wf_cfg, heldout, cfg.eval.temperature, cfg.eval.seed,
                       tcfg.engine, latest_checkpoint(trainer.ckpt_root) or "")
    timings["eval_rl_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start

    results = {
        "method": cfg.method, "workflow": dict(tcfg.workflow), "algorithm": tcfg.algorithm.name,
        "train_chunks": syn.num_chunks, "lengths": list(heldout), "eval_tasks": cfg.eval.num_tasks,
        "eval": asdict(cfg.eval), "heldout_sha256": digest,
        "scripted": demo["summary"], "sft": sft_eval, "rl": rl_eval,
        "demonstrator": {"rows": demo["rows"], "rows_per_task": demo["rows_per_task"]},
        "timings": timings, "num_parameters": n_params, "vocab_size": len(tokenizer),
        "sft_losses": sft_losses, "copy_warmup_losses": warmup,
        "rl_history": {k: [h.get(k, 0.0) for h in history] for k in ("reward/mean", "train/rows")},
    }
    (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    text = results_markdown(results)
    (out / "results.md").write_text(text, encoding="utf-8")
    print(text, end="")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} ({timings['total_s'] / 60:.1f} min)")
    return results
