"""The context-management CPU demo (issue 44): per method, a tiny model trained from scratch, cold start on
the method's scripted agent, then RL, evaluated on held-out tasks at one working-context budget.

  memrl demo --agent context --out runs/context/fold/seed0 method=fold
  memrl demo --agent context --out runs/context/fold --seeds 0,1,2 method=fold   # 3 training seeds
  python benchmarks/context_management.py --trained runs/context                 # the trained table

`method` picks one arm of ARMS below (its workflow section, scripted agent and estimator): react
(sliding_window, window_turns 0: no management, stopped by the budget), window (window_turns 2), summarize,
fold (FoldGRPO with its process rewards), fold_no_process (FoldGRPO with `process_rewards=[]`: the ablation).

`run_context_demo` chains the library's stages: write the task splits (memrl.data.synthetic_memact.write_splits
with `task.padding_words`: every search result costs what a passage does) -> calibrate the budget (0 = the
flawless folding agent's largest prompt, memrl.demonstrators.stages.calibrate_fold_budget, the same for every
arm; it fails when the unmanaged agent would fit) -> init a tiny Qwen2 whose BPE tokenizer is trained on the
task's text and every arm's scripted contexts, so all arms share it (memrl.demos.scratch.init_context_model) -> copy warm-up
(memrl.demos.cold_start.copy_warmup) -> cold start: SFT on the arm's scripted agent (memrl.demonstrators.
context, flaw `sft.late_prob`) played through the arm's workflow, every row as the workflow cuts it
(memrl.demos.cold_start.context_cold_start) -> held-out evaluation of the SFT model -> RL (preset
context_cpu, `algorithm.name` from ARMS) -> the same evaluation after RL. The evaluation
(memrl.eval.evaluator.evaluate_context) is greedy and sampled (one sample per task at `eval.temperature`):
accuracy (all sub-questions right) +- SE over tasks, mean peak / mean context, tokens discarded, turns,
branches, summaries and the share stopped by the budget; beside them the scripted agent on its SFT tasks
and the scripted search agent without a budget on the held-out tasks (`reference.react_unbounded`: the
trained table's "vs unbounded ReAct" peak). Writes results.json and results.md.

Overrides: `key=value` for ContextDemoConfig, `train.<key>=value` for the RL config (preset context_cpu);
`engine.*` and `workflow.*` are spelled as in `memrl train` (they set the RL config's sections, which the
cold start and evaluations use too; the arm's own workflow keys go first, so explicit ones win).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memrl.config import ConfigError, load_config, to_yaml, valid
from memrl.data.synthetic_memact import MemActSplits, MemActTaskConfig, write_splits
from memrl.demonstrators.stages import calibrate_fold_budget, context_agent, context_demonstrations
from memrl.demos import split_overrides
from memrl.demos.cold_start import context_cold_start
from memrl.demos.cold_start import copy_warmup as copy_warmup_stage
from memrl.demos.memact import MemActDemoModel
from memrl.demos.scratch import init_context_model
from memrl.eval.evaluator import EngineRollout, context_summary_of, evaluate_context, model_engine
from memrl.models.tiny import ModelPreset
from memrl.training.assemble import assemble, check_writable, validate
from memrl.training.checkpoint import latest_checkpoint
from memrl.training.config import TrainConfig
from memrl.training.sft import SFTConfig
from memrl.training.trainer import Trainer
from memrl.workflows import get_workflow, parse_workflow

__all__ = ["ARMS", "Arm", "ContextDemoConfig", "ContextDemoEval", "ContextDemoModel", "ContextDemoSFT",
           "load_configs", "results_markdown", "run_context_demo"]


@dataclass(frozen=True)
class Arm:
    """One method of the comparison: its workflow section (merged over the preset's), its scripted agent
    (memrl.demonstrators.stages.context_agent kind) and its RL overrides."""

    workflow: dict[str, Any]
    agent: str
    algorithm: tuple[str, ...]


_GRPO = ("algorithm.name=grpo", "algorithm.grpo.norm_by_std=true")
ARMS: dict[str, Arm] = {
    "react": Arm({"name": "sliding_window", "window_turns": 0}, "search", _GRPO),
    "window": Arm({"name": "sliding_window", "window_turns": 2}, "search", _GRPO),
    "summarize": Arm({"name": "summarize", "summary_fraction": 0.7}, "summary", _GRPO),
    "fold": Arm({"name": "fold"}, "fold", ("algorithm.name=foldgrpo",)),
    "fold_no_process": Arm({"name": "fold"}, "fold", ("algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[]")),
}
"""`method` -> its arm. GRPO arms divide by the group's reward std (as FoldGRPO does), so the estimators differ
only in the process rewards and the rows they weigh; the scripted agents are benchmarks/context_management.py's.
summary_fraction 0.7 (the benchmark's 0.8 at its sizes): at the demo's sizes one search result is ~30% of the
calibrated budget, and at 0.8 the flawless summary agent searches past the budget before it is asked for a
summary (0% on 100 held-out tasks, 100% at 0.7, seed 0)."""


ContextDemoModel = MemActDemoModel
"""The tiny Qwen2 trained from scratch: the MemAct demo's shape settings (its max_positions must hold the
budget plus one turn, checked once the budget is known)."""


@dataclass
class ContextDemoSFT:
    """Cold start on the arm's scripted agent (memrl.demonstrators.context) through the arm's workflow."""

    num_tasks: int = valid(2000, ge=1)
    late_prob: float = valid(0.0, ge=0, le=1)
    """The fold / summary agent's flaw (FoldDemonstrator: searches in the main thread; SummaryDemonstrator:
    keeps only the last fact); must be 0 for react and window (the search agent has none)."""
    seed: int = valid(500, ge=0)
    """Seed of the demonstration tasks (and of the agent's flaw)."""
    copy_warmup_steps: int = valid(1500, ge=0, note="0 = off")
    """Copy warm-up steps before the cold start (memrl.demos.cold_start.copy_warmup): the induction heads a
    model trained from scratch needs to copy names and values (the MemAct demo's finding)."""
    copy_warmup_rows: int = valid(0, ge=0, note="0 = 4 x batch_rows")
    epochs: int = valid(2, ge=1)
    lr: float = valid(1e-3, gt=0)
    batch_rows: int = valid(8, ge=1)
    warmup_steps: int = valid(20, ge=0)


@dataclass
class ContextDemoEval:
    """Held-out evaluation, fixed before any run: benchmarks/context_management.py's task seed (901, used by
    no other split), greedy then one sample per task at `temperature`."""

    num_tasks: int = valid(200, ge=2)
    seed: int = valid(901, ge=0)
    temperature: float = valid(1.0, gt=0)


@dataclass
class ContextDemoConfig:
    """`memrl demo --agent context` settings; the RL settings are the `context_cpu` preset (+ train.*)."""

    method: str = valid("fold", choices=tuple(ARMS))
    model: ContextDemoModel = field(default_factory=ContextDemoModel)
    task: MemActTaskConfig = field(default_factory=lambda: MemActTaskConfig(sub_questions=[5], padding_words=40))
    """5 facts per task, 40 filler words per document: the calibrated budget (folding's largest prompt, 481
    tokens at seed 0) stops the unmanaged agent after its second search (its unbounded peak is 784)."""
    sft: ContextDemoSFT = field(default_factory=ContextDemoSFT)
    eval: ContextDemoEval = field(default_factory=ContextDemoEval)
    rl_tasks: int = valid(2000, ge=1)
    rl_task_seed: int = valid(100, ge=0)
    context_budget: int = valid(0, ge=0, note="0 = calibrated")
    """workflow.max_context_tokens of the cold start, RL and evaluation, the same for every arm. 0 = the
    flawless folding agent's largest prompt on the first 200 SFT tasks (calibrate_fold_budget)."""
    seed: int = valid(0, ge=0)
    """Seed of the tokenizer, the model's initial weights, the copy warm-up and the SFT order."""
    train_preset: str = "context_cpu"
    threads: int = valid(0, ge=0, note="0 = torch's default")


def load_configs(overrides: list[str], out_dir: str | Path) -> tuple[ContextDemoConfig, Any, Path, Arm]:
    """(demo config, RL config, writable output dir, arm); fails on a bad value before any work."""
    demo_ov, train_ov = split_overrides(list(overrides))
    cfg = load_config(ContextDemoConfig, demo_ov)
    if cfg.method not in ARMS:
        raise ConfigError(f"method must be one of {', '.join(ARMS)}, got {cfg.method!r}")
    arm = ARMS[cfg.method]
    if arm.agent == "search" and cfg.sft.late_prob:
        raise ConfigError(f"sft.late_prob must be 0 for method={cfg.method} (the search agent has no flaw), "
                          f"got {cfg.sft.late_prob}")
    out = check_writable(out_dir, "--out")
    arm_ov = [f"workflow={arm.workflow['name']}",
              *[f"workflow.{k}={v}" for k, v in arm.workflow.items() if k != "name"], *arm.algorithm]
    tcfg = load_config(TrainConfig, [f"model.path={out / 'sft'}", f"out_dir={out / 'rl'}", "data.name=file",
                                     f"data.path={out / 'data' / 'train_tasks.jsonl'}", *arm_ov, *train_ov],
                       preset=cfg.train_preset)
    spec, _ = validate(tcfg)
    if spec.name != arm.workflow["name"]:
        raise ConfigError(f"workflow.name must be {arm.workflow['name']} for method={cfg.method}, got {spec.name!r}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return cfg, tcfg, out, arm


def _section(tcfg: Any, name: str, **changes: Any) -> Any:
    """The config of workflow `name` with `changes`, its other fields from the RL config's workflow section
    where that workflow has them (the calibration's and the reference's unbudgeted agents)."""
    return parse_workflow({"name": name, **changes}, defaults=dict(tcfg.workflow))[1]


def model_shape(cfg: ContextDemoConfig) -> ModelPreset:
    m = cfg.model
    return ModelPreset(m.vocab_size, m.hidden_size, 2 * m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads,
                       max_position_embeddings=m.max_positions)


def evaluate(model: Any, tokenizer: Any, spec: Any, wf_cfg: Any, tasks: list[Any], temperature: float, seed: int,
             engine_cfg: Any, model_dir: str | Path = "") -> dict[str, dict[str, float]]:
    """{"greedy": summary, "sampled": summary} on the held-out tasks (memrl.eval.evaluator.evaluate_context)."""
    with model_engine(model, tokenizer, engine_cfg, model_dir) as engine:
        return evaluate_context(EngineRollout(engine, spec), wf_cfg, tasks, temperature, seed)


def results_markdown(results: dict[str, Any]) -> str:
    """The run's table: one row per policy and decoding."""
    lines = [f"# context demo: method={results['method']} ({results['budget']['eval_tasks']} held-out tasks, "
             f"budget {results['budget']['max_context_tokens']} tokens)", "",
             "| policy | decoding | accuracy | peak context | mean context | tokens discarded | turns | branches "
             "| summaries | stopped by budget |", "|---|---|---|---|---|---|---|---|---|---|"]
    for policy, label in (("scripted", "scripted (its SFT tasks)"), ("sft", "SFT"), ("rl", "SFT + RL")):
        for mode, r in results[policy].items():
            lines.append(f"| {label} | {mode} | {r['accuracy']:.1f} +- {r['accuracy_se']:.1f} "
                         f"| {r['peak_context_tokens']:.0f} | {r['mean_context_tokens']:.0f} "
                         f"| {r['tokens_discarded']:.0f} | {r['turns']:.1f} | {r['branches']:.2f} "
                         f"| {r['summaries']:.2f} | {r['stopped_by_budget']:.0f}% |")
    return "\n".join(lines) + "\n"


def run_context_demo(out_dir: str | Path, overrides: list[str]) -> dict[str, Any]:
    """Run the whole demo for one arm (module docstring); returns what results.json holds."""
    t_start = time.perf_counter()
    cfg, tcfg, out, arm = load_configs(overrides, out_dir)
    (out / "demo_config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    data: MemActSplits = write_splits(cfg.task, out / "data", sft=(cfg.sft.num_tasks, cfg.sft.seed),
                                      rl=(cfg.rl_tasks, cfg.rl_task_seed), heldout=(cfg.eval.num_tasks, cfg.eval.seed))
    agent = context_agent(arm.agent, cfg.sft.late_prob, cfg.sft.seed)
    shape = model_shape(cfg)
    spec = get_workflow(arm.workflow["name"])
    unbudgeted = _section(tcfg, spec.name, max_context_tokens=10**9)
    fold_cfg = _section(tcfg, "fold", max_context_tokens=10**9)
    react_cfg = _section(tcfg, "sliding_window", window_turns=0, max_context_tokens=10**9)
    # one tokenizer for every arm (the same seed gives the same tokenizer and budget whatever the method):
    # trained on every scripted agent's contexts without a budget
    plays = [("fold", fold_cfg, context_agent("fold")), ("sliding_window", react_cfg, context_agent("search")),
             ("summarize", _section(tcfg, "summarize", max_context_tokens=10**9), context_agent("summary"))]
    tokenizer, model = init_context_model(out, cfg.task, plays, data.sft_tasks, shape, cfg.model.vocab_size, cfg.seed)
    budget = cfg.context_budget or calibrate_fold_budget(data.sft_tasks[:200], tokenizer, fold_cfg, react_cfg)
    if budget + unbudgeted.max_turn_tokens > cfg.model.max_positions:
        raise ConfigError(f"model.max_positions {cfg.model.max_positions} < the budget {budget} + "
                          f"workflow.max_turn_tokens {unbudgeted.max_turn_tokens}")
    tcfg.workflow["max_context_tokens"] = budget
    spec, wf_cfg = validate(tcfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"method {cfg.method}: workflow {spec.name}, {tcfg.algorithm.name}; budget {budget} tokens; "
          f"model {n_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}")
    timings["init_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    s = cfg.sft
    rows = s.copy_warmup_rows or 4 * s.batch_rows
    warmup = (copy_warmup_stage(model, tokenizer, s.copy_warmup_steps, rows, s.lr, cfg.seed, out / "copy_warmup",
                                progress=tcfg.trainer.progress) if s.copy_warmup_steps else [])
    timings["copy_warmup_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    scfg = SFTConfig(epochs=s.epochs, batch_rows=s.batch_rows, lr=s.lr, warmup_steps=s.warmup_steps, seed=cfg.seed)
    sft_losses, demo = context_cold_start(model, tokenizer, data.sft_tasks, spec.name, wf_cfg, agent, scfg,
                                          out / "sft", seed=s.seed, progress=tcfg.trainer.progress)
    timings["sft_s"] = time.perf_counter() - t0

    def heldout(policy: Any, model_dir: str | Path) -> dict[str, dict[str, float]]:
        return evaluate(policy, tokenizer, spec, wf_cfg, data.eval_tasks, cfg.eval.temperature,
                        cfg.eval.seed, tcfg.engine, model_dir)

    t0 = time.perf_counter()
    sft_eval = heldout(model, out / "sft")
    timings["eval_sft_s"] = time.perf_counter() - t0
    # the reference of the trained table's "vs unbounded ReAct" column: the scripted search agent without a
    # budget on the same held-out tasks, in this run's tokens
    unbounded = context_summary_of(context_demonstrations(
        data.eval_tasks, tokenizer, "sliding_window",
        react_cfg, context_agent("search")))

    t0 = time.perf_counter()
    trainer = Trainer(assemble(tcfg, workflow=(spec, wf_cfg)))
    history = trainer.fit()
    timings["rl_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rl_eval = heldout(trainer.model, latest_checkpoint(trainer.ckpt_root) or "")
    timings["eval_rl_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start

    results = {
        "method": cfg.method, "workflow": dict(tcfg.workflow), "algorithm": tcfg.algorithm.name,
        "process_rewards": list(tcfg.algorithm.foldgrpo.process_rewards) if tcfg.algorithm.name == "foldgrpo" else [],
        "scripted": {"greedy": demo["summary"]}, "sft": sft_eval, "rl": rl_eval,
        "reference": {"react_unbounded": unbounded},
        "demonstrator": {k: v for k, v in demo.items() if k != "summary"},
        "timings": timings, "num_parameters": n_params, "vocab_size": len(tokenizer),
        "sft_losses": sft_losses, "copy_warmup_losses": warmup,
        "rl_history": {k: [h.get(k, 0.0) for h in history] for k in ("reward/mean", "train/rows")},
        "budget": {"max_context_tokens": budget, "eval_tasks": len(data.eval_tasks)},
    }
    (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    text = results_markdown(results)
    (out / "results.md").write_text(text, encoding="utf-8")
    print(text, end="")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} ({timings['total_s'] / 60:.1f} min)")
    return results
