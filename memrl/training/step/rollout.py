"""Rollout for training: sample groups through the run's RolloutRuntime, score them, apply dynamic sampling."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memrl.algorithms.selection import filter_zero_variance_groups
from memrl.types import Group, Score, Task
from memrl.workflows.rollouts import apply_scores

log = logging.getLogger(__name__)


@dataclass
class RolloutResult:
    """The groups that train this step, plus what was sampled and dropped on the way."""

    groups: list[Group]
    scores: list[list[Score]] = field(default_factory=list)
    """The score stage's result for `groups` (`[group][trajectory]`; already applied onto them)."""
    sampled_groups: int = 0
    dropped_groups: int = 0
    seconds: float = 0.0
    all_rewards: list[float] = field(default_factory=list)
    """Outcome rewards of every sampled trajectory (kept or dropped), for honest reward curves."""
    end_position: int = 0
    """Asynchronous training: the data position after this batch's tasks (what a checkpoint resumes at)."""


async def asample_groups(
    next_tasks: Callable[[int], list[Task]],
    runtime: Any,
    batch_size: int,
    n: int,
    seed: int,
    dynamic_sampling: bool = False,
    max_refill_rounds: int = 0,
    engine: Any = None,
) -> RolloutResult:
    """Per round: `runtime.asample` -> `runtime.ascore` -> apply_scores, on the run's runtime
    (memrl.runtime.RolloutRuntime: `runtime.run(asample_groups(...))`, one event loop for the whole run).
    `batch_size` tasks x n; with dynamic sampling, drop zero-variance groups and refill with fresh tasks
    for up to `max_refill_rounds` more rounds (the batch may end up smaller). `engine`: sample through it
    instead of the runtime's (the asynchronous producer's versioned gate)."""
    t0 = time.perf_counter()
    res = RolloutResult(groups=[])
    want = batch_size
    for rnd in range(1 + (max_refill_rounds if dynamic_sampling else 0)):
        tasks = next_tasks(want)
        groups = await runtime.asample(tasks, n, seed=seed * 1000 + rnd, engine=engine)
        scores = await runtime.ascore(groups)
        apply_scores(groups, scores)  # reward, metrics, info and Segment.step_reward, in one place
        res.sampled_groups += len(groups)
        res.all_rewards.extend(r for g in groups for r in g.rewards)
        by_group = {id(g): sc for g, sc in zip(groups, scores, strict=True)}
        if dynamic_sampling:
            groups, dropped = filter_zero_variance_groups(groups)
            res.dropped_groups += dropped
        kept = groups[: batch_size - len(res.groups)]
        res.groups.extend(kept)
        res.scores.extend(by_group[id(g)] for g in kept)
        want = batch_size - len(res.groups)
        if want <= 0:
            break
    res.seconds = time.perf_counter() - t0
    return res
