"""The MemAct CPU demo: a tiny model learns, with DCPO, when to prune its working context.

  memrl demo --agent memact --out runs/memact_demo
  memrl demo --agent memact --out runs/m sft.epochs=2 train.trainer.steps=10 eval.num_tasks=100

This module holds the demo's configs and `run_memact_demo`, which runs the recipe pipeline's stages (the
method supplies its model's text, budget, scripted agent and evaluation): write the task splits
(memrl.data.synthetic_memact.write_splits: SFT / RL / held-out tasks, each with its own fact sheet that
the agent searches with BM25) -> init a ~0.6M-parameter Qwen2 whose tokenizer is trained on the task's
text (memrl.recipes.scratch.init_model) -> calibrate the working-context budget
(memrl.demonstrators.stages.calibrate_budget) -> copy warm-up and cold-start SFT on the scripted agent's
trajectories (memrl.recipes.cold_start; the agent, memrl.demonstrators.memact, prunes late with
probability `sft.late_prob`), played through the real memact workflow, so the SFT rows are the workflow's
segments -> DCPO (preset memact_dcpo_cpu) -> the same held-out evaluation of the SFT and the SFT+DCPO
policy: greedy and sampled (one sample per task, temperature `eval.temperature`;
memrl.recipes.summaries.evaluate_memact), summarized by `FIELDS`: accuracy (all sub-questions right) with its
standard error, accuracy per question count, mean and peak working-context tokens, prunes per task, overflow
rate -> results.md (printed), results.json (memrl.recipes.pipeline.results; its facts: the budget and
the cold start's statistics), memact_results.png (memrl.recipes.report).

`variant=curation` (VARIANTS below) is the context-curation task of docs/concepts/memact.md "Context curation": a
budget in which search alone answers every task, so pruning only shortens the context; add
`workflow.prune_tool=false` for its search-only arm (benchmarks/memact_curation.py runs both over seeds).

Overrides: `key=value` for the demo config (MemActDemoConfig below), `train.<key>=value` for the DCPO
config (preset memact_dcpo_cpu); `engine.*` and `workflow.*` are spelled as in `memrl train` (they set
the DCPO config's sections, which the demo's cold start and evaluations use too).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from memrl.config import (
    MAX_COUNT,
    MAX_PARALLEL,
    MAX_SEED,
    MAX_TOKENS,
    MAX_VOCAB,
    ConfigError,
    valid,
)
from memrl.data.synthetic_memact import tokenizer_text
from memrl.demonstrators.memact import answer_reply, prune_reply, search_reply
from memrl.demonstrators.stages import calibrate_budget, calibrate_search_only_budget, memact_demonstrations
from memrl.eval.fields import Field, accuracy, accuracy_se, maximum, mean, mean_where, summary_rows
from memrl.recipes.parts import (
    BUDGET_NOTE,
    SWEEP_BUDGET,
    SplitConfig,
    SplitRecipe,
    count_parameters,
    engine_eval,
    set_workflow,
    write_data,
)
from memrl.recipes.pipeline import (
    EvalSettings,
    RecipeRun,
    TaskSFTSettings,
    need_workflow,
    run_recipe,
)
from memrl.recipes.report import MEMACT_TABLE, plot_memact, print_memact_eval
from memrl.recipes.scratch import init_model as scratch_init
from memrl.recipes.summaries import evaluate_memact, one_per_task
from memrl.recipes.tables import SweepTable
from memrl.types import Segment
from memrl.workflows.memact import answer_format

__all__ = ["FIELDS", "RECIPE", "MemActDemoConfig", "MemActDemoEval", "MemActDemoSFT", "VARIANTS", "context_budget",
           "expand_variant", "fields_for", "init_model", "run_memact_demo", "write_data"]

SE_DDOF = 0
"""The MemAct demo's standard error: binomial, sqrt(p (1 - p) / tasks) (one 0/1 sample per task)."""

FIELDS = (
    Field("num_tasks", one_per_task("memact")),  # first: the one-trajectory-per-task check
    Field("accuracy", accuracy(SE_DDOF)), Field("accuracy_se", accuracy_se(SE_DDOF)),
    Field("subq_accuracy", mean("multiq_subq_accuracy", 100.0)),
    Field("mean_context_tokens", mean("mean_context_tokens")), Field("peak_context_tokens", mean("peak_context_tokens")),
    Field("max_context_tokens", maximum("peak_context_tokens")), Field("prunes_per_task", mean("prunes")),
    Field("failed_prunes_per_task", mean("failed_prunes")), Field("overflow", mean("stop_context_budget", 100.0)),
    Field("turns", mean("turns")))
"""A MemAct evaluation's summary (one trajectory per task): accuracy (all sub-questions right, %) and its
binomial SE, sub-question accuracy (%), mean / peak working context, the largest peak, prunes and failed prunes
per task, overflow (stopped by the context budget, %), turns, the number of tasks; `fields_for` adds the
accuracy per question count."""


def fields_for(sub_questions: list[int]) -> tuple[Field, ...]:
    """`FIELDS` plus "accuracy_<k>q" for each question count k the tasks draw (sorted): the mean reward (%) of the
    tasks with k sub-questions (None where the rows have none)."""
    return (*FIELDS, *(Field(f"accuracy_{k}q", mean_where("multiq_questions", k)) for k in sorted(set(sub_questions))))


@dataclass
class MemActDemoSFT(TaskSFTSettings):
    """Cold start on the scripted agent's trajectories (memrl.demonstrators.memact.MemActDemonstrator)."""

    num_tasks: int = valid(4000, ge=1, le=MAX_COUNT)
    """Demonstration tasks; each gives one segment per prune plus the final one."""
    late_prob: float = valid(0.6, ge=0, le=1)
    """The scripted agent's flaw: the probability it searches on instead of pruning, overflowing the budget
    (under `budget=search_only` searching on fits: then it is how often the agent chooses not to prune)."""
    keep_results: int = valid(2, ge=1, le=MAX_COUNT)
    """Search results the scripted agent lets pile up before it prunes (MemActDemonstrator.keep_results)."""
    search_topk: int = valid(1, ge=1, le=MAX_VOCAB)
    """Passages the scripted agent's searches ask for (1: the asked fact alone; 2: also a distractor fact of
    the same name). The working-context budget is calibrated with it."""
    copy_warmup_steps: int = valid(1500, ge=0, le=MAX_COUNT, note="0 = off")
    """Steps (of `copy_warmup_rows` rows) of copy warm-up before the cold start: random token sequences, each
    followed by itself (memrl.training.sft.copy_warmup_segments). A model trained from scratch has no
    induction heads, and without them it never learned to copy a name into a query or a value into an
    answer (at chance after 2,400 SFT steps); the warm-up forms them at ~700 steps (docs/concepts/memact.md). 0 = off."""
    epochs: int = valid(4, ge=1, le=MAX_COUNT)
    """~2,400 steps: with 2 epochs the cold start copied only some values (sampled sub-question accuracy 42%
    vs 47% at 4 epochs, 3-question tasks 6.5% vs 41.8%; docs/concepts/memact.md). lr 1e-3: 3e-3 and 6e-3
    learned more slowly in the runs that chose this recipe (3e-3 also stops the copy warm-up from forming
    induction); batch_rows 8: the model needs many steps (~1000) before it copies names and values at all."""


@dataclass
class MemActDemoEval(EvalSettings):
    """Held-out evaluation, fixed before any run: new fact sheets (another task seed), same protocol for both
    policies (greedy, then one sample per task at `temperature`, the DCPO rollouts' own). Its seed is the
    held-out tasks' (SFT uses sft.seed, DCPO rl_task_seed)."""

    num_tasks: int = valid(300, ge=1, le=MAX_COUNT)


@dataclass
class MemActDemoConfig(SplitConfig):
    """`memrl demo --agent memact` settings; the DCPO settings are the `memact_dcpo_cpu` preset (+ train.*)."""

    # model: its text runs out of merges at about 900 tokens
    sft: MemActDemoSFT = field(default_factory=MemActDemoSFT)
    eval: MemActDemoEval = field(default_factory=MemActDemoEval)
    rl_tasks: int = valid(5000, ge=1, le=MAX_COUNT)
    """Training tasks written for DCPO (read in shuffled epochs)."""
    context_budget: int = valid(0, ge=0, le=MAX_TOKENS, note="0 = calibrated")
    """The working-context budget (workflow.max_context_tokens of the cold start, DCPO and evaluation).
    0 = calibrated with the demo's tokenizer on the first 200 SFT tasks, by `budget`."""
    budget: str = valid("prune", choices=("prune", "search_only"))
    """How a calibrated budget is set: "prune" = the largest prompt the scripted agent without its flaw
    reaches (the task prompt and two search results; the demo checks that no prompt holding three search
    results fits, so 3-question tasks need a prune); "search_only" = the largest prompt of the search-only
    scripted agent (every result kept), so search alone answers every task and pruning only shortens the
    context (the `curation` variant)."""
    variant: str = ""
    """A named setting: "" = the demo as documented; "curation" = the context-curation task (VARIANTS
    below, docs/concepts/memact.md "Context curation"): its overrides go first, so explicit ones win."""
    seed: int = valid(0, ge=0, le=MAX_SEED)
    """Seed of the tokenizer and the model's initial weights."""
    train_preset: str = "memact_dcpo_cpu"
    threads: int = valid(0, ge=0, le=MAX_PARALLEL, note="0 = torch's default")
    """torch threads (0 = torch's default)."""


VARIANTS: dict[str, tuple[str, ...]] = {
    "curation": (
        "task.sub_questions=[8]", "task.entities_per_task=8", "sft.search_topk=4", "budget=search_only",
        "sft.keep_results=2", "sft.late_prob=0.25", "train.workflow.max_assistant_turns=14",
        "train.workflow.system_noprune_template=Search, answer.",
    ),
}
"""`variant=<name>` -> the overrides it stands for. curation (issue 33, docs/concepts/memact.md "Context curation"):
8 sub-questions per task about 8 names, each search returns the name's 4 facts (the asked one first), and
the budget holds the task prompt and all 8 results, so a search-only agent can answer every task and pruning
is a choice that shortens the working context (by at most 34.7%, pruning every 2 results: docs/concepts/memact.md);
the scripted agent prunes the 2 results it holds into a note with probability 0.75 (searches on otherwise),
so 14 assistant turns hold its 8 searches, 3 prunes and the answer; the search-only arm's system prompt is
as short as the pruning arm's. Withhold the prune tool with `workflow.prune_tool=false` (cold start, DCPO
and evaluation). The first measurement used 4 sub-questions (`task.sub_questions=[4]
task.entities_per_task=6 train.workflow.max_assistant_turns=10`), where pruning can save at most 17.6%."""


def expand_variant(overrides: list[str]) -> list[str]:
    """`overrides` with a `variant=<name>` entry's VARIANTS overrides put first (explicit ones win)."""
    names = [ov.split("=", 1)[1] for ov in overrides if ov.split("=", 1)[0] == "variant"]
    if not names or names[-1] == "":
        return list(overrides)
    if names[-1] not in VARIANTS:
        raise ConfigError(f"variant must be one of {', '.join(sorted(VARIANTS))} (or empty), got {names[-1]!r}")
    return [*VARIANTS[names[-1]], *overrides]


# ------------------------------------------------------------------ stage helpers (tests call init_model)


def init_model(cfg: MemActDemoConfig, wf_cfg: Any, sample_tasks: list[Any], out: Path) -> tuple[Any, Any]:
    """(tokenizer, model) (memrl.recipes.scratch.init_model): BPE on the task's text, the filled templates and the
    scripted agent's replies on the first 40 `sample_tasks`, then again with the whole working contexts it
    reaches on the first 60 (no budget) with that first tokenizer; the model of `model.*` to out/init."""
    sys_tpl, user_tpl = wf_cfg.templates(True)
    extra = [sys_tpl.render(), "tools: search prune_context",
             "Removed r1, r2, r3. Your memory note stays in your prune_context call above."]
    for task in sample_tasks[:40]:
        names, attrs = task.meta["entities"], task.meta["attributes"]
        instruction = wf_cfg.answer_instruction if wf_cfg.answer_instruction is not None else answer_format(task)
        extra.append(user_tpl.render(question=task.question, answer_format=instruction))
        extra += [search_reply(a, n, cfg.sft.search_topk) for a, n in zip(attrs, names, strict=True)]
        extra.append(prune_reply([(n, a, v) for n, a, v in zip(names, attrs, task.answers, strict=True)],
                                 ["r1", "r2"]))
        extra.append(answer_reply(task.answers))
    big = replace(wf_cfg, max_context_tokens=MAX_TOKENS)
    return scratch_init(out, cfg.model.preset(), cfg.model.vocab_size, cfg.seed, partial(tokenizer_text, cfg.task),
                        extra, lambda tok: memact_demonstrations(sample_tasks[:60], tok, big, 0.5, 0, cfg.sft.search_topk))


def context_budget(cfg: MemActDemoConfig, tokenizer: Any, wf_cfg: Any, sft_tasks: list[Any]) -> int:
    """`context_budget`, or calibrated on the first 200 SFT tasks by `budget`."""
    if cfg.context_budget:
        return cfg.context_budget
    calibrate = calibrate_search_only_budget if cfg.budget == "search_only" else calibrate_budget
    return calibrate(sft_tasks[:200], tokenizer, wf_cfg, cfg.sft.search_topk)


# ---------------------------------------------------------------------------------------------- the demo


class MemActRecipe(SplitRecipe):
    """The MemAct demo as a recipe method (module docstring)."""

    name = "memact"
    config = MemActDemoConfig
    settings = replace(SplitRecipe.settings, outputs=("results.md", "results.json", "memact_results.png"),
                       sweep_extras=SWEEP_BUDGET,
                       demo_format="prunes/task {prunes_per_task:.2f}, overflow {overflow:.1f}%")

    fields = FIELDS
    table = MEMACT_TABLE
    sweep = SweepTable((("accuracy (%)", "accuracy", 1), ("2-question", "accuracy_2q", 1),
                        ("3-question", "accuracy_3q", 1), ("mean context (tokens)", "mean_context_tokens", 1),
                        ("peak context (tokens)", "peak_context_tokens", 1), ("prunes / task", "prunes_per_task", 2)),
                       (("cold start (SFT)", "sft"), ("SFT + DCPO", "rl"), ("DCPO - SFT", "gain")), note=BUDGET_NOTE)

    def fields_for(self, cfg: Any) -> tuple[Any, ...]:
        return fields_for(cfg.task.sub_questions)

    def expand(self, overrides: list[str]) -> list[str]:
        return expand_variant(overrides)

    def check_run(self, run: RecipeRun) -> None:
        need_workflow(run, "memact", " for the MemAct demo")

    def init(self, run: RecipeRun) -> None:
        cfg = run.cfg
        run.extra["data"] = data = write_data(cfg, run.out / "data")
        run.tokenizer, run.model = init_model(cfg, run.wf_cfg, data.sft_tasks, run.out)
        n_params = count_parameters(run.model)
        budget = context_budget(cfg, run.tokenizer, run.wf_cfg, data.sft_tasks)
        set_workflow(run, max_context_tokens=budget)
        run.facts["budget"] = {"max_context_tokens": budget, "eval_tasks": len(data.eval_tasks)}
        print(f"working-context budget: {budget} tokens")
        print(f"model: {n_params / 1e6:.2f}M parameters, vocabulary {len(run.tokenizer)}")

    def play(self, run: RecipeRun) -> list[Any]:
        """The scripted agent (it prunes late with `sft.late_prob`; never prunes where `workflow.prune_tool` is
        false) through the memact workflow, one row per prune plus the final one."""
        s = run.cfg.sft
        return memact_demonstrations(run.extra["data"].sft_tasks, run.tokenizer, run.wf_cfg, s.late_prob, s.seed,
                                     s.search_topk, s.keep_results, prune_tool=run.wf_cfg.prune_tool)

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], dict[str, Any]]:
        """The cold start's rows and its scripted agent's summary only (the facts' cold_start)."""
        rows, stats = super().demonstrations(run)
        return rows, {"summary": stats["summary"]}

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> list[dict[str, Any]]:
        rows = engine_eval(evaluate_memact, run, model, model_dir, run.extra["data"].eval_tasks,
                           prune_tool=run.wf_cfg.prune_tool, policy=policy)
        print_memact_eval("SFT" if policy == "sft" else "SFT+DCPO", summary_rows(rows, self.fields_for(run.cfg)))
        return rows

    def plot(self, results: dict[str, Any], out: Path) -> None:
        plot_memact(out / "memact_results.png", results)


RECIPE = MemActRecipe()
run_memact_demo = partial(run_recipe, RECIPE)
"""Run the whole demo (module docstring): (out_dir, overrides) -> what results.json holds."""
