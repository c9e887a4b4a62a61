"""Workflows: `async def run(task, engine, cfg, rng[, services]) -> Trajectory`, registered by name.

Every command spells a workflow's settings the same way: `workflow=<name>` (or `workflow.name=<name>`)
chooses it and `workflow.<field>=value` sets a field of its config dataclass; `parse_workflow` turns that
section into (WorkflowSpec, config) once per run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from memrl.types import Task, Trajectory


@dataclass(frozen=True)
class WorkflowSpec:
    """A registered workflow: its run function, its config dataclass, its outcome reward and (optionally)
    its step rewards.

    `run(task, engine, cfg, rng[, services])` generates only. `reward(task, traj[, services])` returns a
    float or a memrl.types.Score, or an awaitable of one (an LLM judge); `step_rewards(task, traj)` returns
    one value (or None) per segment. Both are pure (they write nothing onto the trajectory): callers use
    memrl.workflows.runner.score_trajectory / score_groups, which return Scores. A function with a
    `services` parameter gets the run's memrl.runtime.Services (retriever and judge clients).
    """

    name: str
    run: Callable[..., Awaitable[Trajectory]]
    config_cls: type
    reward: Callable[..., Any]
    step_rewards: Callable[[Task, Trajectory], list[float | None]] | None = None


_REGISTRY: dict[str, Callable[[], WorkflowSpec]] = {}


def register_workflow(name: str, factory: Callable[[], WorkflowSpec]) -> None:
    _REGISTRY[name] = factory


def get_workflow(name: str) -> WorkflowSpec:
    if name not in _REGISTRY:
        raise KeyError(f"unknown workflow {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]()


def workflow_names() -> list[str]:
    return sorted(_REGISTRY)


def parse_workflow(
    section: Mapping[str, Any], defaults: Mapping[str, Any] | None = None, where: str = "workflow"
) -> tuple[WorkflowSpec, Any]:
    """(spec, typed config) from a `workflow` section {name, <field>: value, ...}; `defaults` fill the
    fields the section leaves out (only those the workflow's config has). Errors name `where.<key>`."""
    from memrl.config import ConfigError, section_from_dict

    values = dict(section)
    name = values.pop("name", None)
    if not name:
        raise ConfigError(f"{where}.name is required (one of {', '.join(workflow_names())})")
    try:
        spec = get_workflow(str(name))
    except KeyError as e:
        raise ConfigError(f"{where}.name: {e.args[0]}") from e
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    if "options" in values and "options" not in fields:
        raise ConfigError(f"{where}.options.<field> is now spelled {where}.<field> (e.g. {where}.chunk_tokens=...)")
    renamed = getattr(spec.config_cls, "RENAMED", {})  # old spellings of moved fields: say the new one
    for k in values:
        if k in renamed and k not in fields:
            raise ConfigError(f"{where}.{k} is now spelled {where}.{renamed[k]}")
    for k, v in (defaults or {}).items():
        if k in fields:
            values.setdefault(k, v)
    return spec, section_from_dict(spec.config_cls, values, where)


FORMAT_KEYS = (
    "no_box", "missing_update", "empty_update", "multiple_updates", "unclosed_update",
    "multiple_recalls", "unclosed_recall", "empty_recall",
    "no_final_marker", "malformed_calls", "answer_unparsed",
)  # fmt: skip
"""Trajectory metrics that count a format error or a fallback (no \\boxed{} answer, ReMemR1's tag errors,
MemAct's missing FINAL_ANSWER:, malformed tool calls and unparseable answers)."""


def format_counts(metrics: list[dict[str, float]]) -> dict[str, int]:
    """How many trajectories show each format error at least once (keys some trajectory reports)."""
    return {k: sum(1 for m in metrics if m.get(k, 0.0) > 0) for k in FORMAT_KEYS if any(k in m for m in metrics)}


def boxed_em_outcome(task: Task, traj: Trajectory) -> float:
    """Outcome reward shared by the chunked workflows: the verifier named by `traj.info["reward"]` (the
    workflow's `reward` field, memrl.rewards.verifiers; `boxed_em` when absent) on the final answer text."""
    from memrl.rewards.verifiers import get_verifier

    return get_verifier(traj.info.get("reward", "boxed_em"))(traj.info.get("answer_text", ""), task.answers)


def _memagent() -> WorkflowSpec:
    from memrl.workflows import memagent

    return WorkflowSpec("memagent", memagent.run, memagent.MemAgentConfig, memagent.reward, memagent.step_rewards)


register_workflow("memagent", _memagent)


def _try_register(name: str, module: str) -> None:
    """Workflows that arrive in later modules register lazily, so a missing one fails by name only."""

    def factory() -> WorkflowSpec:
        import importlib

        mod: Any = importlib.import_module(module)
        return mod.SPEC

    register_workflow(name, factory)


_try_register("rememr1", "memrl.workflows.rememr1")
_try_register("full_context", "memrl.workflows.full_context")
_try_register("memact", "memrl.workflows.memact")
