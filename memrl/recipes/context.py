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
task's text and every arm's scripted contexts, so all arms share it (memrl.recipes.scratch.init_context_model) -> copy warm-up
(memrl.recipes.cold_start.copy_warmup) -> cold start: SFT on the arm's scripted agent (memrl.demonstrators.
context, flaw `sft.late_prob`) played through the arm's workflow, every row as the workflow cuts it
(ContextRecipe.demonstrations; `sft_from` / `warmup_from` reuse another run's: memrl.recipes.reuse) ->
held-out evaluation of the SFT model -> RL (preset context_cpu, `algorithm.name` from ARMS) -> the same evaluation after RL. The evaluation
(memrl.recipes.summaries.evaluate_context) is greedy and sampled (one sample per task at `eval.temperature`):
accuracy (all sub-questions right) +- SE over tasks, mean peak / mean context, tokens discarded, turns,
branches, summaries and the share stopped by the budget; beside them the scripted agent on its SFT tasks
and the scripted search agent without a budget on the held-out tasks (`reference.react_unbounded`: the
trained table's "vs unbounded ReAct" peak). Writes results.json and results.md.

Overrides: `key=value` for ContextDemoConfig, `train.<key>=value` for the RL config (preset context_cpu);
`engine.*` and `workflow.*` are spelled as in `memrl train` (they set the RL config's sections, which the
cold start and evaluations use too; the arm's own workflow keys go first, so explicit ones win).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from memrl.config import MAX_COUNT, MAX_SEED, MAX_TOKENS, ConfigError, valid
from memrl.data.synthetic_memact import MemActTaskConfig
from memrl.demonstrators.stages import calibrate_fold_budget, context_demonstrations, context_demonstrator
from memrl.recipes.parts import (
    GRPO,
    Arm,
    ArmRecipe,
    SplitConfig,
    SplitRecipe,
    count_parameters,
    engine_eval,
    results_head,
    results_tail,
    scripted_rows,
    workflow_section,
    write_data,
)
from memrl.recipes.pipeline import EvalSettings, ModelShape, RecipeRun, TaskSFTSettings, run_recipe
from memrl.recipes.reuse import reused_cold_start, reused_warmup, take_cold_start
from memrl.recipes.scratch import init_context_model
from memrl.recipes.seeds import budget_extra, budget_line, table_rows
from memrl.recipes.summaries import context_markdown, context_summary_of, evaluate_context
from memrl.training.assemble import validate
from memrl.types import Segment

__all__ = ["ARMS", "RECIPE", "Arm", "ContextDemoConfig", "ContextDemoEval", "ContextDemoSFT",
           "results_markdown", "run_context_demo"]

ARMS: dict[str, Arm] = {
    "react": Arm({"name": "sliding_window", "window_turns": 0}, GRPO, "search"),
    "window": Arm({"name": "sliding_window", "window_turns": 2}, GRPO, "search"),
    "summarize": Arm({"name": "summarize", "summary_fraction": 0.7}, GRPO, "summary"),
    "fold": Arm({"name": "fold"}, ("algorithm.name=foldgrpo",), "fold"),
    "fold_no_process": Arm({"name": "fold"}, ("algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[]"), "fold"),
}
"""`method` -> its arm. GRPO arms divide by the group's reward std (as FoldGRPO does), so the estimators differ
only in the process rewards and the rows they weigh; the scripted agents are benchmarks/context_management.py's.
summary_fraction 0.7 (the benchmark's 0.8 at its sizes): at the demo's sizes one search result is ~30% of the
calibrated budget, and at 0.8 the flawless summary agent searches past the budget before it is asked for a
summary (0% on 100 held-out tasks, 100% at 0.7, seed 0)."""


@dataclass
class ContextDemoSFT(TaskSFTSettings):
    """Cold start on the arm's scripted agent (memrl.demonstrators.context) through the arm's workflow; the
    copy warm-up before it gives a model trained from scratch the induction heads it needs to copy names and
    values (the MemAct demo's finding)."""

    num_tasks: int = valid(2000, ge=1, le=MAX_COUNT)
    late_prob: float = valid(0.0, ge=0, le=1)
    """The fold / summary agent's flaw (FoldDemonstrator: searches in the main thread; SummaryDemonstrator:
    keeps only the last fact); must be 0 for react and window (the search agent has none)."""
    seed: int = valid(500, ge=0, le=MAX_SEED)
    """Seed of the demonstration tasks (and of the agent's flaw)."""
    copy_warmup_steps: int = valid(1500, ge=0, le=MAX_COUNT, note="0 = off")
    max_rows: int = valid(0, ge=0, le=MAX_COUNT, note="0 = every row")
    """Train on the first max_rows demonstration rows only (task order): caps a method whose scripted agent cuts
    many rows per task (window: a row per window shift) at another method's cold-start size, without changing
    the SFT tasks (and so the tokenizer every method of a seed shares)."""


@dataclass
class ContextDemoEval(EvalSettings):
    """Held-out evaluation, fixed before any run: benchmarks/context_management.py's task seed (901, used by
    no other split), greedy then one sample per task at `temperature`."""

    num_tasks: int = valid(200, ge=2, le=MAX_COUNT)
    seed: int = valid(901, ge=0, le=MAX_SEED)


@dataclass
class ContextDemoConfig(SplitConfig):
    """`memrl demo --agent context` settings; the RL settings are the `context_cpu` preset (+ train.*)."""

    method: str = valid("fold", choices=tuple(ARMS))
    model: ModelShape = field(default_factory=ModelShape)  # max_positions: the budget plus one turn (checked)
    task: MemActTaskConfig = field(default_factory=lambda: MemActTaskConfig(sub_questions=[5], padding_words=40))
    """5 facts per task, 40 filler words per document: the calibrated budget (folding's largest prompt, 481
    tokens at seed 0) stops the unmanaged agent after its second search (its unbounded peak is 784)."""
    sft: ContextDemoSFT = field(default_factory=ContextDemoSFT)
    eval: ContextDemoEval = field(default_factory=ContextDemoEval)
    context_budget: int = valid(0, ge=0, le=MAX_TOKENS, note="0 = calibrated")
    """workflow.max_context_tokens of the cold start, RL and evaluation, the same for every arm. 0 = the
    flawless folding agent's largest prompt on the first 200 SFT tasks (calibrate_fold_budget)."""
    train_preset: str = "context_cpu"
    warmup_from: str = ""
    """A finished run whose copy warm-up this one reuses ('' = run it here): the warm-up depends only on the
    initial model and tokenizer (the same for every method at one seed) and its own settings, so the methods
    of one seed need one. Its init/ (tokenizer and initial weights) must be byte-equal to this run's and its
    seed and sft.copy_warmup_steps / copy_warmup_rows / lr / batch_rows equal. Under `--seeds` it names the
    other sweep's root, as `sft_from` does."""
    sft_from: str = ""
    """A finished run whose cold start this one reuses ('' = train it here): its SFT checkpoint, budget and
    SFT evaluation are taken as they are and only RL and its evaluation run, so two methods that share a
    cold start (fold and fold_no_process) compare from the same model. Its demo_config.yaml must equal this
    run's apart from `method`, `threads` and `sft_from`, its method must play the same agent through the same
    workflow section, and its RL config's workflow and engine sections must equal this run's. Under
    `--seeds` it names the other sweep's root: each seed reuses the run of the same seed there."""


results_markdown = context_markdown


class ContextRecipe(SplitRecipe, ArmRecipe):
    """The context-management demo as a recipe method (module docstring)."""

    name = "context"
    config = ContextDemoConfig
    arms = ARMS

    def check(self, cfg: Any, train_overrides: list[str]) -> None:
        if self.arm(cfg).agent == "search" and cfg.sft.late_prob:
            raise ConfigError(f"sft.late_prob must be 0 for method={cfg.method} (the search agent has no flaw), "
                              f"got {cfg.sft.late_prob}")

    def load(self, overrides: list[str], out_dir: str | Path) -> RecipeRun:
        run = self.configs(overrides, out_dir)
        arm = ARMS[run.cfg.method]
        run.extra.update(arm=arm, prior=reused_cold_start(run.cfg, run.tcfg, arm, ARMS) if run.cfg.sft_from else None)
        return run

    def init(self, run: RecipeRun) -> None:
        cfg, tcfg, out, prior = run.cfg, run.tcfg, run.out, run.extra["prior"]
        run.extra["data"] = data = write_data(cfg, out / "data")
        if prior is not None:
            return take_cold_start(run, prior)
        unbudgeted = workflow_section(tcfg, run.spec.name, max_context_tokens=MAX_TOKENS)
        fold_cfg = workflow_section(tcfg, "fold", max_context_tokens=MAX_TOKENS)
        react_cfg = workflow_section(tcfg, "sliding_window", window_turns=0, max_context_tokens=MAX_TOKENS)
        # one tokenizer for every arm (the same seed gives the same tokenizer and budget whatever the method):
        # trained on every scripted agent's contexts without a budget
        plays = [("fold", fold_cfg, context_demonstrator("fold")), ("sliding_window", react_cfg, context_demonstrator("search")),
                 ("summarize", workflow_section(tcfg, "summarize", max_context_tokens=MAX_TOKENS),
                  context_demonstrator("summary"))]
        run.tokenizer, run.model = init_context_model(out, cfg.task, plays, data.sft_tasks, cfg.model.preset(),
                                                      cfg.model.vocab_size, cfg.seed)
        budget = cfg.context_budget or calibrate_fold_budget(data.sft_tasks[:200], run.tokenizer, fold_cfg, react_cfg)
        if budget + unbudgeted.max_turn_tokens > cfg.model.max_positions:
            raise ConfigError(f"model.max_positions {cfg.model.max_positions} < the budget {budget} + "
                              f"workflow.max_turn_tokens {unbudgeted.max_turn_tokens}")
        tcfg.workflow["max_context_tokens"] = budget
        run.spec, run.wf_cfg = validate(tcfg)
        n_params = count_parameters(run.model)
        print(f"method {cfg.method}: workflow {run.spec.name}, {tcfg.algorithm.name}; budget {budget} tokens; "
              f"model {n_params / 1e6:.2f}M parameters, vocabulary {len(run.tokenizer)}")
        run.extra.update(budget=budget, n_params=n_params, react_cfg=react_cfg)

    def scripted(self, run: RecipeRun) -> None:
        # the reference of the trained table's "vs unbounded ReAct" column: the scripted search agent without
        # a budget on the same held-out tasks, in this run's tokens
        run.extra["unbounded"] = context_summary_of(context_demonstrations(
            run.extra["data"].eval_tasks, run.tokenizer, "sliding_window", run.extra["react_cfg"],
            context_demonstrator("search")))

    def warmup(self, run: RecipeRun) -> list[float]:
        return reused_warmup(run.cfg, run.out, run.model) if run.cfg.warmup_from else super().warmup(run)

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], dict[str, Any]]:
        """The arm's scripted agent through its workflow, every row as the workflow cuts it (fold: one per
        branch + the main thread; summarize: one per part; sliding_window: one per window shift + the last);
        `sft.max_rows` > 0 keeps the first max_rows rows (task order)."""
        s, workflow = run.cfg.sft, run.spec.name
        agent = context_demonstrator(run.extra["arm"].agent, s.late_prob, s.seed)
        groups = context_demonstrations(run.extra["data"].sft_tasks, run.tokenizer, workflow, run.wf_cfg, agent,
                                        seed=s.seed)
        trajs, rows = scripted_rows(groups)
        summary = context_summary_of(groups)
        print(f"cold start: {len(rows)} rows from {len(groups)} scripted {workflow} trajectories (its accuracy "
              f"{summary['accuracy']:.1f}%, peak context {summary['peak_context_tokens']:.0f}, stopped by the "
              f"budget {summary['stopped_by_budget']:.1f}%)" + (f"; the first {s.max_rows} trained (sft.max_rows)"
                                                                if 0 < s.max_rows < len(rows) else ""))
        trained = rows[:s.max_rows] if s.max_rows else rows
        return trained, {"summary": summary, "rows": len(rows), "rows_trained": len(trained),
                         "rows_per_task": [len(t.segments) for t in trajs],
                         "branches_per_task": [int(t.metrics.get("branches", 0)) for t in trajs],
                         "summaries_per_task": [int(t.metrics.get("summaries", 0)) for t in trajs]}

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> Any:
        return engine_eval(evaluate_context, run, model, model_dir, run.extra["data"].eval_tasks)

    def results(self, run: RecipeRun) -> dict[str, Any]:
        tcfg, demo = run.tcfg, run.demo
        return {
            **results_head(run),
            "process_rewards": list(tcfg.algorithm.foldgrpo.process_rewards) if tcfg.algorithm.name == "foldgrpo"
            else [],
            "scripted": {"greedy": demo["summary"]}, "sft": run.evals["sft"], "rl": run.evals["rl"],
            "reference": {"react_unbounded": run.extra["unbounded"]},
            "demonstrator": {k: v for k, v in demo.items() if k != "summary"}, **results_tail(run),
            "budget": {"max_context_tokens": run.extra["budget"], "eval_tasks": len(run.extra["data"].eval_tasks)},
            "sft_from": run.cfg.sft_from,
        }

    def markdown(self, results: dict[str, Any]) -> str:
        return context_markdown(results)
    summary_fields = ("accuracy", "peak_context_tokens", "mean_context_tokens", "tokens_discarded", "branches",
                      "summaries", "stopped_by_budget")

    def evals(self, results: dict[str, Any]) -> dict[str, Any]:
        return {p: {mode: {"all": s} for mode, s in results[p].items()} for p in ("sft", "rl")}

    def sweep_extra(self, done: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
        return budget_extra(done)

    def sweep_table(self, e: dict[str, Any]) -> list[str]:
        labels = (("cold start (SFT)", "sft"), ("SFT + RL", "rl"), ("RL - SFT", "gain"))
        return ["| policy | decoding | accuracy (%) | peak context | mean context | tokens discarded | branches "
                "| summaries | stopped by budget (%) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|",
                *table_rows(e, labels, self.summary_fields, lambda f: 2 if f in ("branches", "summaries") else 1),
                *budget_line(e)]


RECIPE = ContextRecipe()
run_context_demo = partial(run_recipe, RECIPE)
"""Run the whole demo for one arm (module docstring): (out_dir, overrides) -> what results.json holds."""
