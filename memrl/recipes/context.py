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
task's text and every arm's scripted contexts, so all arms share it (memrl.recipes.scratch.init_model) -> copy warm-up
(memrl.recipes.cold_start.copy_warmup) -> cold start: SFT on the arm's scripted agent (memrl.demonstrators.
context, flaw `sft.late_prob`) played through the arm's workflow, every row as the workflow cuts it
(ContextRecipe.demonstrations; `sft_from` / `warmup_from` reuse another run's: memrl.recipes.reuse) ->
held-out evaluation of the SFT model -> RL (preset context_cpu, `algorithm.name` from ARMS) -> the same evaluation after RL. The evaluation
(memrl.recipes.summaries.evaluate_context) is greedy and sampled (one sample per task at `eval.temperature`),
summarized by `FIELDS`: accuracy (all sub-questions right) +- SE over tasks, mean peak / mean context, tokens
discarded, turns, branches, summaries and the share stopped by the budget; beside them the scripted agent on
its SFT tasks (policy "scripted") and the scripted search agent without a budget on the held-out tasks (policy
"react_unbounded": the trained table's "vs unbounded ReAct" peak). Writes results.json (memrl.recipes.pipeline.
results; its facts: the budget, the process rewards, the cold start's statistics) and results.md.

Overrides: `key=value` for ContextDemoConfig, `train.<key>=value` for the RL config (preset context_cpu);
`engine.*` and `workflow.*` are spelled as in `memrl train` (they set the RL config's sections, which the
cold start and evaluations use too; the arm's own workflow keys go first, so explicit ones win).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from memrl.config import MAX_COUNT, MAX_SEED, MAX_TOKENS, ConfigError, valid
from memrl.data.synthetic_memact import MemActTaskConfig, tokenizer_text
from memrl.demonstrators.memact import answer_reply, search_reply
from memrl.demonstrators.stages import calibrate_fold_budget, context_demonstrations, context_demonstrator
from memrl.eval.fields import Field, accuracy, accuracy_se, mean
from memrl.recipes.parts import (
    BUDGET_NOTE,
    GRPO,
    SWEEP_BUDGET,
    Arm,
    ArmRecipe,
    SplitConfig,
    SplitRecipe,
    describe,
    engine_eval,
    policy_labels,
    set_workflow,
    workflow_section,
    write_data,
)
from memrl.recipes.pipeline import (
    EvalSettings,
    ModelShape,
    RecipeRun,
    TaskSFTSettings,
    play_demonstrations,
    run_recipe,
)
from memrl.recipes.reuse import reused_cold_start, reused_warmup, take_cold_start
from memrl.recipes.scratch import init_model as scratch_init
from memrl.recipes.summaries import evaluate_context, one_per_task, played_rows
from memrl.recipes.tables import ACCURACY_SE, RunTable, SweepTable
from memrl.types import Segment

__all__ = ["ARMS", "FIELDS", "RECIPE", "Arm", "ContextDemoConfig", "ContextDemoEval", "ContextDemoSFT", "run_context_demo"]

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


SE_DDOF = 1
"""The context-management evaluations' standard error: the sample standard deviation over tasks / sqrt(tasks)."""

FIELDS = (
    Field("num_tasks", one_per_task("context")),  # first: the one-trajectory-per-task check
    Field("accuracy", accuracy(SE_DDOF)), Field("accuracy_se", accuracy_se(SE_DDOF)),
    Field("peak_context_tokens", mean("peak_context_tokens")), Field("mean_context_tokens", mean("mean_context_tokens")),
    Field("tokens_discarded", mean("tokens_discarded")), Field("turns", mean("turns")),
    Field("branches", mean("branches")), Field("summaries", mean("summaries")),
    Field("stopped_by_budget", mean("stop_context_budget", 100.0)))
"""A fold / summarize / sliding_window evaluation's summary (one trajectory per task), in the terms of
benchmarks/context_management.py: accuracy (all sub-questions right, %) and its SE over tasks, per-task means of
peak / mean working context, tokens discarded, turns, branches, summaries, the share stopped by the budget (%),
and the number of tasks (first: it checks one trajectory per task)."""


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


def process_rewards(run: RecipeRun) -> list[str]:
    """The facts' process_rewards: FoldGRPO's (none for another estimator)."""
    tcfg = run.tcfg
    return list(tcfg.algorithm.foldgrpo.process_rewards) if tcfg.algorithm.name == "foldgrpo" else []


def tokenizer_texts(plays: list[tuple[str, Any, Any]], sample_tasks: list[Any]) -> list[str]:
    """The strings the shared tokenizer learns beside the task's text: each workflow's own messages (summary
    request and restart where a config has them) and the agents' replies on the first 40 `sample_tasks`."""
    extra = []
    for _, wf_cfg, _ in plays:
        extra += [f"{wf_cfg.answer_instruction or ''} {wf_cfg.system_template or ''}",
                  getattr(wf_cfg, "summary_request", ""), getattr(wf_cfg, "summary_restart", "")]
    for task in sample_tasks[:40]:
        facts = list(zip(task.meta["entities"], task.meta["attributes"], task.answers, strict=True))
        extra.append(task.question)
        extra += [search_reply(a, n, 2) for n, a, _ in facts]
        extra.append("<summary> " + "; ".join(f"{n} {a} {v}" for n, a, v in facts) + "</summary>")
        extra.append(answer_reply(task.answers))
    return extra


PLAYS = (("fold", "fold", {}), ("sliding_window", "search", {"window_turns": 0}), ("summarize", "summary", {}))
"""The scripted agents the shared tokenizer learns the contexts of, without a budget: (workflow, agent, workflow
fields) of every arm's agent, so the same seed gives the same tokenizer and budget whatever the method (fold's
calibrates the budget; the search agent's is the unbounded reference)."""


def init_model(cfg: ContextDemoConfig, tcfg: Any, sft_tasks: list[Any], out: Path) -> tuple[Any, Any, list[Any]]:
    """(tokenizer, model, the unbudgeted plays of `PLAYS`) (memrl.recipes.scratch.init_model): BPE on the task's
    text and `tokenizer_texts`, then again with every play's whole contexts on the first 60 `sft_tasks`; the model
    of `model.*` to out/init."""
    plays = [(wf, workflow_section(tcfg, wf, max_context_tokens=MAX_TOKENS, **kw), context_demonstrator(agent))
             for wf, agent, kw in PLAYS]
    tokenizer, model = scratch_init(out, cfg.model.preset(), cfg.model.vocab_size, cfg.seed,
                                    partial(tokenizer_text, cfg.task), tokenizer_texts(plays, sft_tasks),
                                    lambda tok: [g for wf, c, agent in plays for g in context_demonstrations(
                                        sft_tasks[:60], tok, wf, c, agent)])
    return tokenizer, model, plays


def context_budget(cfg: ContextDemoConfig, tokenizer: Any, plays: list[Any], sft_tasks: list[Any],
                   max_turn_tokens: int) -> int:
    """`context_budget`, or the flawless folding agent's largest prompt on the first 200 `sft_tasks`
    (calibrate_fold_budget; it fails when the unmanaged agent would fit); refused when the budget plus one turn
    passes the model's positions."""
    budget = cfg.context_budget or calibrate_fold_budget(sft_tasks[:200], tokenizer, plays[0][1], plays[1][1])
    if budget + max_turn_tokens > cfg.model.max_positions:
        raise ConfigError(f"model.max_positions {cfg.model.max_positions} < the budget {budget} + "
                          f"workflow.max_turn_tokens {max_turn_tokens}")
    return budget


TABLE = RunTable((("accuracy", ACCURACY_SE), ("peak context", "{peak_context_tokens:.0f}"),
                  ("mean context", "{mean_context_tokens:.0f}"), ("tokens discarded", "{tokens_discarded:.0f}"),
                  ("turns", "{turns:.1f}"), ("branches", "{branches:.2f}"), ("summaries", "{summaries:.2f}"),
                  ("stopped by budget", "{stopped_by_budget:.0f}%")),
                 (("scripted (its SFT tasks)", "scripted"), ("SFT", "sft"), ("SFT + RL", "rl")), align="---",
                 title="# context demo: method={method} ({budget[eval_tasks]} held-out tasks, budget "
                       "{budget[max_context_tokens]} tokens)")
"""results.md: the scripted agent on its SFT tasks, then SFT and SFT + RL per decoding (`FIELDS`' summary rows)."""


class ContextRecipe(SplitRecipe, ArmRecipe):
    """The context-management demo as a recipe method (module docstring)."""

    name = "context"
    config = ContextDemoConfig
    arms = ARMS
    settings = replace(SplitRecipe.settings, sweep_extras=SWEEP_BUDGET, demo_names_workflow=True,
                       demo_format="peak context {peak_context_tokens:.0f}, stopped by the budget "
                       "{stopped_by_budget:.1f}%")
    fields, table = FIELDS, TABLE
    sweep = SweepTable((("accuracy (%)", "accuracy", 1), ("peak context", "peak_context_tokens", 1),
                        ("mean context", "mean_context_tokens", 1), ("tokens discarded", "tokens_discarded", 1),
                        ("branches", "branches", 2), ("summaries", "summaries", 2),
                        ("stopped by budget (%)", "stopped_by_budget", 1)), note=BUDGET_NOTE)

    def check(self, cfg: Any, train_overrides: list[str]) -> None:
        if self.arm(cfg).agent == "search" and cfg.sft.late_prob:
            raise ConfigError(f"sft.late_prob must be 0 for method={cfg.method} (the search agent has no flaw), "
                              f"got {cfg.sft.late_prob}")

    def check_run(self, run: RecipeRun) -> None:
        super().check_run(run)  # then `sft_from`'s run checked (memrl.recipes.reuse)
        run.extra["prior"] = reused_cold_start(run.cfg, run.tcfg, self.arm(run.cfg), ARMS) if run.cfg.sft_from else None

    def init(self, run: RecipeRun) -> None:
        """The task splits; `sft_from`'s cold start, or the shared tokenizer (`init_model`) and `context_budget`."""
        cfg, prior = run.cfg, run.extra["prior"]
        run.extra["data"] = data = write_data(cfg, run.out / "data")
        if prior is not None:
            take_cold_start(run, prior)
        else:
            run.tokenizer, run.model, plays = init_model(cfg, run.tcfg, data.sft_tasks, run.out)
            budget = context_budget(cfg, run.tokenizer, plays, data.sft_tasks, run.wf_cfg.max_turn_tokens)
            set_workflow(run, max_context_tokens=budget)
            describe(run, mid=f"budget {budget} tokens; ")
            run.extra["react_cfg"] = plays[1][1]
            run.facts["budget"] = {"max_context_tokens": budget, "eval_tasks": len(data.eval_tasks)}
        run.facts["process_rewards"] = process_rewards(run)

    def scripted(self, run: RecipeRun) -> list[dict[str, Any]]:
        """The trained table's "vs unbounded ReAct" reference (policy "react_unbounded"): the scripted search
        agent without a budget on the held-out tasks, in this run's tokens."""
        tasks = run.extra["data"].eval_tasks
        return played_rows(context_demonstrations(tasks, run.tokenizer, "sliding_window", run.extra["react_cfg"],
                                                  context_demonstrator("search")),
                           "all", policy_labels(run, "react_unbounded", tasks))

    def warmup(self, run: RecipeRun) -> list[float]:
        return reused_warmup(run.cfg, run.out, run.model) if run.cfg.warmup_from else super().warmup(run)

    def play(self, run: RecipeRun) -> list[Any]:
        """The arm's scripted agent through its workflow, every row as the workflow cuts it (fold: one per
        branch + the main thread; summarize: one per part; sliding_window: one per window shift + the last)."""
        s = run.cfg.sft
        groups = context_demonstrations(run.extra["data"].sft_tasks, run.tokenizer, run.spec.name, run.wf_cfg,
                                        context_demonstrator(self.arm(run.cfg).agent, s.late_prob, s.seed), seed=s.seed)
        # the table's "scripted (its SFT tasks)" row: the played rows, policy "scripted" (no held-out digest)
        run.rows += played_rows(groups, "all", {**policy_labels(run, "scripted", []), "heldout_sha256": ""})
        return groups

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], dict[str, Any]]:
        """`sft.max_rows` > 0 trains the first max_rows rows (task order). The statistics (the facts' cold_start)
        are the row counts; the scripted agent's summary is the summary's "scripted" rows (`play`)."""
        rows, stats = play_demonstrations(self, run, fold_counts)
        trained = rows[:run.cfg.sft.max_rows] if run.cfg.sft.max_rows else rows
        if len(trained) < len(rows):
            print(f"cold start: the first {len(trained)} rows trained (sft.max_rows)")
        return trained, {**{k: v for k, v in stats.items() if k != "summary"}, "rows_trained": len(trained)}

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> list[dict[str, Any]]:
        return engine_eval(evaluate_context, run, model, model_dir, run.extra["data"].eval_tasks, policy=policy)


def fold_counts(trajs: list[Any]) -> dict[str, list[int]]:
    """The cold start's branches and summaries per task (its statistics beside the row counts)."""
    return {k: [int(t.metrics.get(m, 0)) for t in trajs]
            for k, m in (("branches_per_task", "branches"), ("summaries_per_task", "summaries"))}


RECIPE = ContextRecipe()
run_context_demo = partial(run_recipe, RECIPE)
"""Run the whole demo for one arm (module docstring): (out_dir, overrides) -> what results.json holds."""
