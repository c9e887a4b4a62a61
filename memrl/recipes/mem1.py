"""The MEM1 CPU demo (issue 45): a tiny model trained from scratch as a MEM1 agent (`workflow=mem1`,
`context=latest_state`: the prompt, its latest internal state and the latest search result) or as the
full-history agent (`context=full_history`: every turn stays), on the same multi-objective tasks; held-out
tasks with k = 2, 4, 8, 16 objectives measure how each one's peak context grows with k, and at what accuracy.

  memrl demo --agent mem1 --out runs/mem1/mem1/seed0 method=mem1
  memrl demo --agent mem1 --out runs/mem1/full_history --seeds 0,1,2 method=full_history   # 3 training seeds
  python benchmarks/mem1_trained.py --trained runs/mem1                                     # the trained table

`run_mem1_demo` chains: write the task splits (memrl.data.synthetic_memact: SFT and RL tasks with a mixture
of objective counts `task.sub_questions`, 2..16 by default; held-out tasks at each of `eval.objectives`, the
count k drawn from seed `eval.seed + k`, none of them a training seed) -> init a tiny Qwen2 whose BPE
tokenizer is trained on the task's text and the scripted oracle's contexts under BOTH settings, so both
methods share it at one seed (memrl.recipes.scratch.init_model) -> check that `model.max_positions`
holds the scripted full-history agent's largest context at the largest held-out k (so both methods have
the same model shape) -> copy warm-up (memrl.recipes.cold_start.copy_warmup) -> cold start: SFT on the
scripted oracle (memrl.demonstrators.mem1.StateDemonstrator) played through `workflow=mem1` with the method's
`context`, every row as the workflow cuts it (one per turn) -> held-out evaluation of the SFT model -> RL
(preset mem1_cpu, GRPO) -> the same evaluation after RL. The evaluation is, per k, greedy and one sample
per task at `eval.temperature`, summarized by `FIELDS`: accuracy (all objectives right, %) +- SE over tasks, the
objectives' mean accuracy, mean peak and mean context tokens per task, turns; beside them the scripted oracle
on the held-out tasks (policy "scripted"). Writes results.json (memrl.recipes.pipeline.results; its
facts: the positions and the cold start's statistics) and results.md.

Overrides: `key=value` for Mem1DemoConfig, `train.<key>=value` for the RL config (preset mem1_cpu);
`engine.*` and `workflow.*` are spelled as in `memrl train` (they set the RL config's sections, which the
cold start and evaluations use too; `workflow.context` is the method's and may not be set).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from memrl.config import MAX_COUNT, MAX_SEED, valid
from memrl.data.synthetic_memact import MemActTaskConfig, make_tasks, tokenizer_text
from memrl.data.tasks_jsonl import write_tasks
from memrl.demonstrators.mem1 import StateDemonstrator, mem1_demonstrations
from memrl.eval.fields import Field, accuracy, accuracy_se, mean
from memrl.recipes.parts import (
    Arm,
    ArmRecipe,
    SplitConfig,
    SplitRecipe,
    describe,
    engine_eval,
    policy_labels,
    set_workflow,
)
from memrl.recipes.pipeline import (
    EvalSettings,
    ModelShape,
    RecipeRun,
    TaskSFTSettings,
    needs,
    overridden,
    play_demonstrations,
    run_recipe,
)
from memrl.recipes.scratch import init_model
from memrl.recipes.summaries import evaluate_by_bucket, one_per_task, played_rows
from memrl.recipes.tables import ACCURACY_SE, GAIN_ROWS, RunTable, SweepTable
from memrl.types import Segment, Task

__all__ = ["FIELDS", "METHODS", "RECIPE", "Mem1DemoConfig", "Mem1DemoEval", "Mem1DemoSFT", "heldout_tasks",
           "run_mem1_demo"]

METHODS: dict[str, str] = {"mem1": "latest_state", "full_history": "full_history"}
"""`method` -> the mem1 workflow's `context` setting."""
ARMS = {m: Arm({"name": "mem1", "context": c}, ()) for m, c in METHODS.items()}
"""`method` -> its RL config's workflow (memrl.recipes.parts.ArmRecipe)."""


def all_correct(row: Any) -> float:
    """A row's value for the MEM1 demo's accuracy: every objective right (the workflow's multiq_all_correct)."""
    return row["metrics"].get("multiq_all_correct", 0.0)


FIELDS = (
    Field("num_tasks", one_per_task("mem1")),  # first: the one-trajectory-per-task check
    Field("accuracy", accuracy(1, all_correct)), Field("accuracy_se", accuracy_se(1, all_correct)),
    Field("objective_accuracy", mean("multiq_subq_accuracy", 100.0)),
    Field("peak_context_tokens", mean("peak_context_tokens")), Field("mean_context_tokens", mean("mean_context_tokens")),
    Field("turns", mean("turns")), Field("answered", mean("answered", 100.0)))
"""A MEM1 evaluation's summary per objective count (one trajectory per task): accuracy (all objectives right, %)
and its SE over tasks (sample std), the objectives' mean accuracy (%), the per-task means of the peak context
(the workflow's peak_context_tokens: the longest prompt + reply) and of the mean prompt length over the task's
calls (mean_context_tokens), turns, the share answered (%), and the number of tasks (first: it checks one trajectory per task)."""


@dataclass
class Mem1DemoSFT(TaskSFTSettings):
    """Cold start on the scripted oracle (memrl.demonstrators.mem1.StateDemonstrator) through the method's workflow."""

    copy_warmup_steps: int = valid(1500, ge=0, le=MAX_COUNT, note="0 = off")
    epochs: int = valid(4, ge=1, le=MAX_COUNT)
    """~5,000 steps over 1,000 tasks of 2..16 objectives (about 10 rows per task). On 2..8 objectives, 1 epoch
    (745 steps, final loss 0.31-0.34) taught neither method's cold start to answer (0-2%, seed 0) and 4 epochs
    (2,980 steps, loss 0.025) MEM1 90 / 60 / 13% greedy at k = 2 / 4 / 8; on 2..16 with 500 tasks (2,488 steps,
    loss 0.21) MEM1 answered none (docs/log/2026-11-26-mem1-train-2-8.md)."""


@dataclass
class Mem1DemoEval(EvalSettings):
    """Held-out evaluation, fixed before any run: `num_tasks` tasks at each objective count k of
    `objectives`, drawn from seed `seed + k` (903, 905, 909, 917 by default, used by no training split),
    greedy then one sample per task at `temperature`."""

    num_tasks: int = valid(100, ge=2, le=MAX_COUNT)
    objectives: list[int] = valid(default_factory=lambda: [2, 4, 8, 16], ge=1, le=MAX_COUNT)
    seed: int = valid(901, ge=0, le=MAX_SEED)


@dataclass
class Mem1DemoConfig(SplitConfig):
    """`memrl demo --agent mem1` settings; the RL settings are the `mem1_cpu` preset (+ train.*)."""

    method: str = valid("mem1", choices=tuple(METHODS))
    model: ModelShape = field(default_factory=ModelShape)
    """The tiny Qwen2 (the MemAct demo's shape settings). A call's prompt is capped at max_positions -
    workflow.max_turn_tokens (`workflow.max_context_tokens`, unless set lower: the engine refuses a prompt
    past the positions), and the cap must hold the scripted full-history agent's largest prompt at the
    largest held-out k (checked once the tokenizer is trained), so it binds only on a policy that runs on."""
    task: MemActTaskConfig = field(default_factory=lambda: MemActTaskConfig(
        entities_per_task=16, sub_questions=list(range(2, 17))))
    """Training tasks: 2..16 objectives (drawn uniformly per task), 16 names per task world (64 documents),
    so the held-out tasks come from the same worlds and every held-out k is a training count. Trained on
    2..8 only, neither method answered a 16-objective task (both stopped after a few turns on the 16-question
    prompt; docs/log/2026-11-26-mem1-train-2-8.md)."""
    sft: Mem1DemoSFT = field(default_factory=Mem1DemoSFT)
    eval: Mem1DemoEval = field(default_factory=Mem1DemoEval)
    train_preset: str = "mem1_cpu"


def heldout_tasks(cfg: Mem1DemoConfig) -> dict[int, list[Task]]:
    """{k: `eval.num_tasks` tasks of k objectives from seed `eval.seed + k`} (ids "heldout_k<k>_<seed>-<i>")."""
    return {k: make_tasks(replace(cfg.task, sub_questions=[k]), cfg.eval.num_tasks, cfg.eval.seed + k,
                          prefix=f"heldout_k{k}_") for k in cfg.eval.objectives}


def oracle_texts(tasks: list[Task], plays: dict[str, Any]) -> list[str]:
    """Beside the task text, the tokenizer's: each task's prompt, the oracle's first reply and its answer."""
    first, out = next(iter(plays.values())), []
    for task in tasks:
        out += [first.template().render(question=task.question), StateDemonstrator(first.answer_separator)(
            task.question), f"<IS>{';'.join(task.answers)}</IS><answer>{'; '.join(task.answers)}</answer>"]
    return out


def positions(cfg: Mem1DemoConfig, wf_cfg: Any, full: list[Any], kmax: int) -> dict[str, int]:
    """The facts' "positions": the model's, the prompt cap, the scripted full-history agent's (its groups
    `full` at the largest held-out count `kmax`) peak context and largest prompt, which the cap must hold."""
    full_peak = int(max(g.trajectories[0].metrics["peak_context_tokens"] for g in full))
    full_prompt = max(s.info["context_tokens"] for g in full for s in g.trajectories[0].segments)
    needs(full_prompt <= wf_cfg.max_context_tokens, f"workflow.max_context_tokens {wf_cfg.max_context_tokens} "
          f"(model.max_positions {cfg.model.max_positions} - workflow.max_turn_tokens {wf_cfg.max_turn_tokens} unless "
          f"set) < {full_prompt}, the scripted full-history agent's largest prompt at {kmax} objectives")
    return {"max_positions": cfg.model.max_positions, "max_context_tokens": wf_cfg.max_context_tokens,
            "full_history_scripted_peak": full_peak, "full_history_scripted_prompt": full_prompt}


class Mem1Recipe(SplitRecipe, ArmRecipe):
    """The MEM1 demo as a recipe method (module docstring)."""

    name = "mem1"
    config = Mem1DemoConfig
    arms = ARMS
    settings = replace(SplitRecipe.settings, heldout_per="objectives",  # set k drawn at eval.seed + k
                       demo_format="peak context {peak_context_tokens:.0f}")
    fields = FIELDS
    table = RunTable((("accuracy (all right)", ACCURACY_SE, "---"), ("objectives right", "{objective_accuracy:.1f}"),
                      ("peak context", "{peak_context_tokens:.0f}"), ("mean context", "{mean_context_tokens:.0f}"),
                      ("turns", "{turns:.1f}"), ("answered", "{answered:.0f}%")),
                     (("scripted (held-out)", "scripted"), ("SFT", "sft"), ("SFT + RL", "rl")), bucket="objectives",
                     title="# MEM1 demo: method={method} (workflow.context={train[workflow][context]}; "
                     "{config[eval][num_tasks]} held-out tasks per objective count)")
    sweep = SweepTable((("accuracy (%)", "accuracy", 1), ("peak context", "peak_context_tokens", 1),
                        ("mean context", "mean_context_tokens", 1), ("turns", "turns", 1)), GAIN_ROWS[:2],
                       bucket="objectives")

    def check(self, cfg: Any, train_overrides: list[str]) -> None:
        set_context, ks = overridden(train_overrides, "workflow.context"), cfg.eval.objectives
        needs(not set_context, f"workflow.context is set by method ({cfg.method}: {METHODS[cfg.method]}); drop "
              f"{set_context!r}")
        needs(len(set(ks)) == len(ks), f"eval.objectives must be distinct counts, got {ks}")
        needs(max(ks) <= cfg.task.entities_per_task, f"eval.objectives: {max(ks)} objectives need "
              f"task.entities_per_task >= {max(ks)}, got {cfg.task.entities_per_task}")

    def training_task_seeds(self, cfg: Any) -> dict[str, int]:
        return {"sft.seed": cfg.sft.seed, "rl_task_seed": cfg.rl_task_seed}

    def check_run(self, run: RecipeRun) -> None:
        super().check_run(run)
        maxpos, wf_cfg, kmax = run.cfg.model.max_positions, run.wf_cfg, max(run.cfg.eval.objectives)
        needs(wf_cfg.max_turns >= kmax + 1, f"workflow.max_turns {wf_cfg.max_turns} < {kmax + 1} (one search per "
              f"objective and the answer at eval.objectives' largest count {kmax})")
        cap = maxpos - wf_cfg.max_turn_tokens
        needs(cap >= 1, f"model.max_positions {maxpos} must exceed workflow.max_turn_tokens {wf_cfg.max_turn_tokens}")
        needs(wf_cfg.max_context_tokens <= cap, f"workflow.max_context_tokens {wf_cfg.max_context_tokens} > model."
              f"max_positions {maxpos} - workflow.max_turn_tokens {wf_cfg.max_turn_tokens} = {cap}")
        if not wf_cfg.max_context_tokens:  # no call may pass the model's positions (the engine refuses it)
            set_workflow(run, max_context_tokens=cap)
        needs(run.wf_cfg.retriever_scope == "task", "workflow.retriever_scope must be task (each task searches its "
              f"own fact sheet), got {run.wf_cfg.retriever_scope!r}")

    def init(self, run: RecipeRun) -> None:
        cfg, out, wf_cfg = run.cfg, run.out, run.wf_cfg
        sft_tasks = make_tasks(cfg.task, cfg.sft.num_tasks, cfg.sft.seed, prefix="sft")
        write_tasks(out / "data" / "train_tasks.jsonl", make_tasks(cfg.task, cfg.rl_tasks, cfg.rl_task_seed, "rl"))
        held = heldout_tasks(cfg)
        write_tasks(out / "data" / "heldout_tasks.jsonl", [t for ts in held.values() for t in ts])
        # both `context` settings' contexts: the same tokenizer whatever the method
        plays = {c: replace(wf_cfg, context=c, max_context_tokens=0) for c in METHODS.values()}
        run.tokenizer, run.model = init_model(out, cfg.model.preset(), cfg.model.vocab_size, cfg.seed,
                                              partial(tokenizer_text, cfg.task), oracle_texts(sft_tasks[:40], plays),
                                              lambda tok: [g for c in plays.values()
                                                           for g in mem1_demonstrations(sft_tasks[:60], tok, c)])
        kmax = max(cfg.eval.objectives)
        pos = positions(cfg, wf_cfg, mem1_demonstrations(held[kmax], run.tokenizer, plays["full_history"]), kmax)
        describe(run, f" context={wf_cfg.context}", tail=f", positions {cfg.model.max_positions} (full history's "
                 f"scripted peak at k={kmax}: {pos['full_history_scripted_peak']})")
        run.extra.update(sft_tasks=sft_tasks, held=held)
        run.facts["positions"] = pos

    def scripted(self, run: RecipeRun) -> list[dict[str, Any]]:
        """The scripted oracle on the held-out tasks of each objective count (policy "scripted", greedy)."""
        held = run.extra["held"]
        labels = policy_labels(run, "scripted", held)
        return [r for k, ts in held.items() for r in played_rows(mem1_demonstrations(ts, run.tokenizer, run.wf_cfg),
                                                                  k, labels)]

    def play(self, run: RecipeRun) -> list[Any]:
        return mem1_demonstrations(run.extra["sft_tasks"], run.tokenizer, run.wf_cfg, seed=run.cfg.sft.seed)

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], dict[str, Any]]:
        return play_demonstrations(self, run, lambda trajs: {
            "objectives_per_task": [len(t.meta["sub_questions"]) for t in run.extra["sft_tasks"]]})

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> list[dict[str, Any]]:
        return engine_eval(evaluate_by_bucket, run, model, model_dir, run.extra["held"], policy=policy)


RECIPE = Mem1Recipe()
run_mem1_demo = partial(run_recipe, RECIPE)
"""Run the whole demo for one method (module docstring): (out_dir, overrides) -> what results.json holds."""
