"""The MemAct CPU demo: a tiny model learns, with DCPO, when to prune its working context.

  memrl demo --agent memact --out runs/memact_demo
  memrl demo --agent memact --out runs/m sft.epochs=2 train.trainer.steps=10 eval.num_tasks=100

This module holds the demo's configs and `run_memact_demo`, which chains the library's stages (the
functions between them only map the configs onto one library call each): write the task splits
(memrl.data.synthetic_memact.write_splits: SFT / RL / held-out tasks, each with its own fact sheet that
the agent searches with BM25) -> init a ~0.6M-parameter Qwen2 whose tokenizer is trained on the task's
text (memrl.recipes.scratch.init_memact_model) -> calibrate the working-context budget
(memrl.demonstrators.stages.calibrate_budget) -> copy warm-up and cold-start SFT on the scripted agent's
trajectories (memrl.recipes.cold_start; the agent, memrl.demonstrators.memact, prunes late with
probability `sft.late_prob`), played through the real memact workflow, so the SFT rows are the workflow's
segments -> DCPO (preset memact_dcpo_cpu) -> the same held-out evaluation of the SFT and the SFT+DCPO
policy: greedy and sampled (one sample per task, temperature `eval.temperature`), accuracy (all
sub-questions right) with its standard error, mean and peak working-context tokens, prunes per task,
overflow rate (memrl.recipes.summaries.evaluate_memact) -> results.md (printed), results.json,
memact_results.png (memrl.recipes.report).

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
from memrl.demonstrators.stages import calibrate_budget, calibrate_search_only_budget, memact_demonstrations
from memrl.eval.evaluator import EngineRollout, model_engine
from memrl.recipes.parts import SplitConfig, SplitRecipe, count_parameters, write_data
from memrl.recipes.pipeline import EvalSettings, RecipeRun, TaskSFTSettings, run_recipe
from memrl.recipes.report import print_memact_eval, write_memact_outputs
from memrl.recipes.scratch import init_memact_model
from memrl.recipes.seeds import budget_extra, budget_line, table_rows
from memrl.recipes.summaries import evaluate_memact, memact_summary_of
from memrl.types import Segment
from memrl.workflows import get_workflow

__all__ = ["RECIPE", "MemActDemoConfig", "MemActDemoEval", "MemActDemoSFT", "VARIANTS", "calibrate_budget",
           "context_budget", "copy_warmup_rows", "demonstrations", "evaluate", "expand_variant", "init_model",
           "run_memact_demo", "summarize_groups", "write_data"]


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


# ------------------------------------------------------------------ the demo's configs on the library's stages
# (one call each; benchmarks/ and tests call them by these names; write_data is memrl.recipes.parts')


def init_model(cfg: MemActDemoConfig, wf_cfg: Any, sample_tasks: list[Any], out: Path) -> tuple[Any, Any]:
    """(tokenizer, model): memrl.recipes.scratch.init_memact_model at the `model.*` shape."""
    return init_memact_model(out, cfg.task, wf_cfg, sample_tasks, cfg.model.preset(), cfg.model.vocab_size, cfg.seed,
                             cfg.sft.search_topk)


def copy_warmup_rows(cfg: MemActDemoConfig) -> int:
    """Rows per copy warm-up step: `sft.copy_warmup_rows`, or 4 x `sft.batch_rows` when it is 0."""
    return cfg.sft.warmup_rows()


def context_budget(cfg: MemActDemoConfig, tokenizer: Any, wf_cfg: Any, sft_tasks: list[Any]) -> int:
    """The working-context budget: `context_budget`, or calibrated by `budget` on the first 200 SFT tasks."""
    if cfg.context_budget:
        return cfg.context_budget
    if cfg.budget == "search_only":
        return calibrate_search_only_budget(sft_tasks[:200], tokenizer, wf_cfg, cfg.sft.search_topk)
    return calibrate_budget(sft_tasks[:200], tokenizer, wf_cfg, cfg.sft.search_topk)


def evaluate(model: Any, tokenizer: Any, wf_cfg: Any, tasks: list[Any], temperature: float,
             seed: int, engine_cfg: Any, model_dir: str | Path = "") -> dict[str, dict[str, float]]:
    """{"greedy": summary, "sampled": summary} of the policy on the held-out tasks (each searching its own
    fact sheet): memrl.recipes.summaries.evaluate_memact through the engine `engine_cfg` names, the prune tool
    offered unless `wf_cfg.prune_tool` is False."""
    with model_engine(model, tokenizer, engine_cfg, model_dir) as engine:
        return evaluate_memact(EngineRollout(engine, get_workflow("memact")), wf_cfg, tasks, temperature, seed,
                               prune_tool=wf_cfg.prune_tool)


demonstrations = memact_demonstrations
summarize_groups = memact_summary_of


# ---------------------------------------------------------------------------------------------- the demo


class MemActRecipe(SplitRecipe):
    """The MemAct demo as a recipe method (module docstring)."""

    name = "memact"
    config = MemActDemoConfig
    outputs = ("results.md", "results.json", "memact_results.png")

    def expand(self, overrides: list[str]) -> list[str]:
        return expand_variant(overrides)

    def check_run(self, run: RecipeRun) -> None:
        self.need_workflow(run, "memact", " for the MemAct demo")

    def init(self, run: RecipeRun) -> None:
        cfg = run.cfg
        data = write_data(cfg, run.out / "data")
        run.tokenizer, run.model = init_model(cfg, run.wf_cfg, data.sft_tasks, run.out)
        n_params = count_parameters(run.model)
        budget = context_budget(cfg, run.tokenizer, run.wf_cfg, data.sft_tasks)
        run.wf_cfg = replace(run.wf_cfg, max_context_tokens=budget)
        run.tcfg.workflow["max_context_tokens"] = budget
        print(f"working-context budget: {budget} tokens")
        print(f"model: {n_params / 1e6:.2f}M parameters, vocabulary {len(run.tokenizer)}")
        run.extra.update(data=data, sft_tasks=data.sft_tasks, n_params=n_params)

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], dict[str, float]]:
        """The scripted agent (pruning late with probability `sft.late_prob`; the search-only agent when
        `workflow.prune_tool` is false) through the memact workflow, one row per prune plus the final one."""
        s, wf_cfg = run.cfg.sft, run.wf_cfg
        groups = memact_demonstrations(run.extra["sft_tasks"], run.tokenizer, wf_cfg, s.late_prob, s.seed,
                                       s.search_topk, s.keep_results, prune_tool=wf_cfg.prune_tool)
        rows = [r for g in groups for r in g.trajectories[0].segments]
        stats = memact_summary_of(groups)
        print(f"cold start: {len(rows)} rows from {len(groups)} scripted trajectories (its accuracy "
              f"{stats['accuracy']:.1f}%, prunes/task {stats['prunes_per_task']:.2f}, overflow "
              f"{stats['overflow']:.1f}%)")
        return rows, stats

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> Any:
        res = evaluate(model, run.tokenizer, run.wf_cfg, run.extra["data"].eval_tasks, run.cfg.eval.temperature,
                       run.cfg.eval.seed, run.tcfg.engine, model_dir)
        print_memact_eval("SFT" if policy == "sft" else "SFT+DCPO", res)
        return res

    def results(self, run: RecipeRun) -> dict[str, Any]:
        return {
            "sft": run.evals["sft"], "dcpo": run.evals["rl"], "demonstrator": run.demo, "timings": run.timings,
            "num_parameters": run.extra["n_params"], "vocab_size": len(run.tokenizer), "sft_losses": run.sft_losses,
            "copy_warmup_losses": run.warmup_losses,
            "rl": {k: [h.get(k, 0.0) for h in run.history]
                   for k in ("reward/mean", "dcpo/pruned_share", "dcpo/selected", "dcpo/available",
                             "dcpo/segments_per_trajectory", "rollout/segments")},
            "budget": {"max_context_tokens": run.wf_cfg.max_context_tokens,
                       "eval_tasks": len(run.extra["data"].eval_tasks)},
        }

    summary_fields = ("accuracy", "accuracy_2q", "accuracy_3q", "mean_context_tokens", "peak_context_tokens",
                      "prunes_per_task")
    optional_fields = ("accuracy_2q", "accuracy_3q")

    def evals(self, results: dict[str, Any]) -> dict[str, Any]:
        return {p: {mode: {"all": s} for mode, s in results[key].items()} for p, key in (("sft", "sft"), ("rl", "dcpo"))}

    def sweep_extra(self, done: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
        return budget_extra(done)

    def sweep_table(self, e: dict[str, Any]) -> list[str]:
        labels = (("cold start (SFT)", "sft"), ("SFT + DCPO", "rl"), ("DCPO - SFT", "gain"))
        return ["| policy | decoding | accuracy (%) | 2-question | 3-question | mean context (tokens) | "
                "peak context (tokens) | prunes / task |", "|---|---|---:|---:|---:|---:|---:|---:|",
                *table_rows(e, labels, self.summary_fields, lambda f: 2 if f == "prunes_per_task" else 1),
                *budget_line(e)]

    def write(self, results: dict[str, Any], out: Path) -> str:
        """results.json, results.md and memact_results.png (memrl.recipes.report)."""
        return write_memact_outputs(results, out)


RECIPE = MemActRecipe()
run_memact_demo = partial(run_recipe, RECIPE)
"""Run the whole demo (module docstring): (out_dir, overrides) -> what results.json holds."""
