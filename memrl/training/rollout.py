"""Rollout for training: sample groups through the run's RolloutRuntime, score them, apply dynamic sampling."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from memrl.types import Group, Score, Task

log = logging.getLogger(__name__)


@dataclass
class RolloutResult:
    """The groups that train this step, plus what was sampled and dropped on the way."""

    groups: list[Group]
    scores: list[list[Score]] = field(default_factory=list)
    """The score stage's result for `groups` ([group][trajectory]; already applied onto them)."""
    sampled_groups: int = 0
    dropped_groups: int = 0
    rounds: int = 0
    seconds: float = 0.0
    all_rewards: list[float] = field(default_factory=list)
    """Outcome rewards of every sampled trajectory (kept or dropped), for honest reward curves."""


def sample_groups(
    next_tasks: Callable[[int], list[Task]],
    runtime: Any,
    batch_size: int,
    n: int,
    seed: int,
    dynamic_sampling: bool = False,
    max_refill_rounds: int = 0,
) -> RolloutResult:
    """Per round: `runtime.sample` -> `runtime.score` -> apply_scores (memrl.runtime.RolloutRuntime, one
    event loop for the whole run). `batch_size` tasks x n; with dynamic sampling, drop zero-variance groups
    and refill with fresh tasks for up to `max_refill_rounds` more rounds (the batch may end up smaller)."""
    from memrl.algorithms.selection import filter_zero_variance_groups
    from memrl.workflows.runner import apply_scores

    t0 = time.perf_counter()
    res = RolloutResult(groups=[])
    want = batch_size
    for rnd in range(1 + (max_refill_rounds if dynamic_sampling else 0)):
        tasks = next_tasks(want)
        groups = runtime.sample(tasks, n, seed=seed * 1000 + rnd)
        scores = runtime.score(groups)
        apply_scores(groups, scores)  # reward, metrics, info and Segment.step_reward, in one place
        res.rounds += 1
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


def task_batches(stream: Iterator[Task], position: int) -> Callable[[int], list[Task]]:
    """A `next_tasks(k)` over an iterator; the caller tracks the position for checkpoints."""

    def take(k: int) -> list[Task]:
        return [next(stream) for _ in range(k)]

    return take
