"""The pieces several recipe methods share (memrl.recipes.pipeline runs them; each method module declares only
what differs): the task-split methods' seeds, files and tasks (`SplitRecipe`: memact, context, mem1), the
arm-picking methods' RL config (`ArmRecipe`: context, infmem), the held-out evaluation through an engine
and its rows' labels (`engine_eval`, `policy_labels`), and the sweep extras several methods declare alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from memrl.config import MAX_COUNT, MAX_SEED, valid
from memrl.data.synthetic_memact import MemActSplits, MemActTaskConfig, write_splits
from memrl.eval.evaluator import EngineRollout, model_engine, tasks_sha256
from memrl.recipes.pipeline import MethodSettings, ModelShape, Recipe, RecipeConfig, RecipeRun, need_workflow
from memrl.training.assemble import validate
from memrl.workflows import parse_workflow

# ---------------------------------------------------------------------------------------------- task splits


@dataclass
class SplitConfig(RecipeConfig):
    """RecipeConfig plus what a task-split method's demo config shares: the model shape, the task and the RL
    tasks written for training."""

    model: ModelShape = field(default_factory=ModelShape)
    task: MemActTaskConfig = field(default_factory=MemActTaskConfig)
    rl_tasks: int = valid(2000, ge=1, le=MAX_COUNT)
    rl_task_seed: int = valid(100, ge=0, le=MAX_SEED)


class SplitRecipe(Recipe):
    """A method trained on written task splits (memrl.data.synthetic_memact): SFT tasks at `sft.seed`, RL tasks
    (`rl_tasks` at `rl_task_seed`, data/train_tasks.jsonl, read by RL as `data.name=file`), held-out tasks."""

    settings = MethodSettings(seed_keys=(("seed", "demo"), ("sft.seed", "demo"), ("rl_task_seed", "demo"),
                                         ("train.data.seed", "train"), ("train.trainer.seed", "train")),
                              task_seeds=("sft.seed", "rl_task_seed"))

    def train_overrides(self, cfg: Any, out_dir: str | Path) -> list[str]:
        return ["data.name=file", f"data.path={Path(out_dir) / 'data' / 'train_tasks.jsonl'}",
                *super().train_overrides(cfg, out_dir)]


def write_data(cfg: Any, data_dir: Path) -> MemActSplits:
    """SFT tasks (in memory), RL tasks (data/train_tasks.jsonl), held-out tasks (data/heldout_tasks.jsonl)."""
    return write_splits(cfg.task, data_dir, sft=(cfg.sft.num_tasks, cfg.sft.seed),
                        rl=(cfg.rl_tasks, cfg.rl_task_seed), heldout=(cfg.eval.num_tasks, cfg.eval.seed))


# ---------------------------------------------------------------------------------------------- arms


@dataclass(frozen=True)
class Arm:
    """One method of a comparison: its workflow section (merged over the preset's), its RL overrides and,
    where the method names one, its scripted agent (memrl.demonstrators.stages.context_demonstrator kind)."""

    workflow: dict[str, Any]
    algorithm: tuple[str, ...]
    agent: str = ""


GRPO = ("algorithm.name=grpo", "algorithm.grpo.norm_by_std=true")
"""GRPO with the group's reward std normalised (as FoldGRPO does)."""


class ArmRecipe(Recipe):
    """A method whose config's `method` picks one of `arms`: the arm's workflow keys and RL overrides go first
    in the RL config (explicit overrides win) and the workflow parsed must be the arm's."""

    arms: ClassVar[dict[str, Arm]] = {}

    def arm(self, cfg: Any) -> Arm:
        return self.arms[cfg.method]  # `method`'s choices are the arms (checked as the config loads)

    def train_overrides(self, cfg: Any, out_dir: str | Path) -> list[str]:
        arm = self.arm(cfg)
        return [*super().train_overrides(cfg, out_dir), f"workflow={arm.workflow['name']}",
                *[f"workflow.{k}={json.dumps(v)}" for k, v in arm.workflow.items() if k != "name"], *arm.algorithm]

    def check_run(self, run: RecipeRun) -> None:
        super().check_run(run)
        need_workflow(run, self.arm(run.cfg).workflow["name"], f" for method={run.cfg.method}")


def workflow_section(tcfg: Any, name: str, **fields: Any) -> Any:
    """The config of workflow `name` with `fields`, its other fields from the RL config's workflow section
    where that workflow has them (the unbudgeted agents that train the shared tokenizer, calibrate the budget)."""
    return parse_workflow({"name": name, **fields}, defaults=dict(tcfg.workflow))[1]


def set_workflow(run: RecipeRun, **fields: Any) -> None:
    """Set `fields` in the RL config's workflow section and validate it again (run.spec, run.wf_cfg): what a method
    derives once its model is made (a calibrated budget)."""
    run.tcfg.workflow.update(fields)
    run.spec, run.wf_cfg = validate(run.tcfg)


# ---------------------------------------------------------------------------------------------- stages


def engine_eval(evaluate: Callable[..., Any], run: RecipeRun, model: Any, model_dir: str | Path, tasks: Any,
                *args: Any, policy: str = "", **kw: Any) -> Any:
    """The one held-out evaluation through an engine: `evaluate(rollout, run.wf_cfg, tasks, *args, **kw)` with
    `model` served by the RL config's engine; `args` default to (eval.temperature, eval.seed)
    (memrl.recipes.summaries' protocols, which return rows). With `policy`, `kw` gains its `policy_labels`: the evaluation's rows
    go to the run's ROWS file of that policy."""
    if policy:
        kw.update(policy_labels(run, policy, tasks))
    with model_engine(model, run.tokenizer, run.tcfg.engine, model_dir) as engine:
        return evaluate(EngineRollout(engine, run.spec), run.wf_cfg, tasks,
                        *(args or (run.cfg.eval.temperature, run.cfg.eval.seed)), **kw)


ROWS = "eval_rows/{}.jsonl"
"""A policy's evaluation rows in a recipe run's folder (memrl.eval.evaluator.evaluation_rows: one per
trajectory of its held-out evaluation, every bucket and decoding)."""


def policy_labels(run: RecipeRun, policy: str, tasks: Any) -> dict[str, Any]:
    """memrl.eval.evaluator.evaluate_rows' row labels of `policy`'s evaluation on `tasks` (a list, or lists by
    bucket): the policy, the tasks' digest (tasks_sha256) and the run's ROWS file of the policy, emptied."""
    path = run.out / ROWS.format(policy)
    path.unlink(missing_ok=True)
    flat = [t for ts in tasks.values() for t in ts] if isinstance(tasks, dict) else list(tasks)
    return {"policy": policy, "heldout_sha256": tasks_sha256(flat), "rows_to": path}


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def describe(run: RecipeRun, workflow: str = "", mid: str = "", tail: str = "") -> None:
    """Print the run's line (method, workflow + `workflow`, estimator, `mid`, the model's size and vocabulary,
    `tail`) once the model is made; run.extra["n_params"] = its parameter count."""
    run.extra["n_params"] = n = count_parameters(run.model)
    print(f"method {run.cfg.method}: workflow {run.spec.name}{workflow}, {run.tcfg.algorithm.name}; {mid}model "
          f"{n / 1e6:.2f}M parameters, vocabulary {len(run.tokenizer)}{tail}")


# ---------------------------------------------------------------------------------------------- sweep extras


SWEEP_METHOD = {"method": ("first", "method")}
"""A sweep extra: the method of the sweep's runs (its table's title)."""

SWEEP_BUDGET = {"budget": ("mean", "facts.budget.max_context_tokens")}
"""A sweep extra: the runs' calibrated working-context budget (their facts' budget), mean +- sd (memact, context)."""
BUDGET_NOTE = ("budget", "Working-context budget (calibrated per run): {} tokens.")
"""The sweep table's note of `SWEEP_BUDGET`."""
