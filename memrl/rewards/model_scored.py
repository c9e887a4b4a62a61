"""Rewards scored by the trainer's own model in the score stage (`algorithm.model_reward`): their contract
(registered with memrl.algorithms.base.register_model_reward; InfoMem's, memrl.rewards.memory_gain, is built in).

A model-scored reward is `fn(groups, *, scorer, memory_prompts, tokenizer, **options) -> ModelScored`:
`scorer(rows)` returns each row's teacher-forced response log-probabilities under the current policy, all
rows in one batched pass (the trainer's workers, `WorkerGroup.old_logprobs`); `memory_prompts(task, traj)`
is the workflow's (WorkflowSpec.memory_prompts, bound to its config and tokenizer; None when it has none).
It returns the trajectories' new rewards and what it measured; the trainer writes them (the outcome stays in
`Trajectory.metrics["outcome_reward"]`). The lookups are memrl.rewards.registry's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memrl.types import Segment, Task, Trajectory

Scorer = Callable[[Sequence[Segment]], list[list[float]]]
MemoryPrompts = Callable[[Task, Trajectory], tuple[list[int], list[int]]]
NONE = "none"
"""algorithm.model_reward's value for no model-scored reward."""


@dataclass
class ModelScored:
    """What a model-scored reward returns: `rewards[group][trajectory]` (the rewards that train),
    `values[group][trajectory]` (its own measurement per trajectory, None where it scored none: logged on
    the trajectory as `<name>` in its metrics), and step metrics (`<name>/...`, the scored tokens included)."""

    rewards: list[list[float]]
    values: list[list[float | None]]
    metrics: dict[str, float] = field(default_factory=dict)
