"""Run a workflow over tasks x n samples concurrently, through one engine, into Groups."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from memrl.engines.base import Engine
from memrl.errors import UserError, fault_point
from memrl.types import Group, Task, Trajectory
from memrl.workflows import WorkflowSpec

log = logging.getLogger(__name__)


class RolloutError(RuntimeError):
    """A workflow failed on one task; the message names the task and sample."""


async def score_trajectory(spec: WorkflowSpec, task: Task, traj: Trajectory) -> float:
    """spec.reward (plain or async) as a float; a failing reward is logged, scored 0 and counted.

    The count is `traj.metrics["reward_error"] = 1.0` (absent when the reward worked).
    """
    try:
        value = spec.reward(task, traj)
        if inspect.isawaitable(value):
            value = await value
        return float(value)
    except Exception as e:  # noqa: BLE001 - a reward service may fail in any way; never crash the run
        log.warning("reward of %s failed on task %s: %s: %s", spec.name, task.task_id, type(e).__name__, e)
        traj.metrics["reward_error"] = 1.0
        return 0.0


def trajectory_rng(seed: int, task_id: str, sample: int) -> random.Random:
    """Per-trajectory RNG: the same (seed, task, sample) always samples the same way."""
    return random.Random(f"{seed}:{task_id}:{sample}")


async def rollout(
    tasks: Sequence[Task],
    spec: WorkflowSpec,
    engine: Engine,
    cfg: Any,
    n: int = 1,
    concurrency: int = 64,
    seed: int = 0,
    on_done: Callable[[Task, Trajectory], None] | None = None,
    score: bool = True,
) -> list[Group]:
    """n trajectories per task, at most `concurrency` in flight; one Group per task, in task order.

    Trajectory ids are "<task_id>#<sample>". With score=True each trajectory gets spec.reward.
    """
    if n < 1:
        raise ValueError(f"rollout: n must be >= 1, got {n}")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("rollout: task ids must be unique within a batch")
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task, k: int) -> Trajectory:
        async with sem:
            try:
                traj = await spec.run(task, engine, cfg, trajectory_rng(seed, task.task_id, k))
            except UserError:  # a config / data mistake (e.g. MemAct's retriever): one line, named already
                raise
            except Exception as e:  # noqa: BLE001 - re-raised with the task named
                raise RolloutError(f"workflow {spec.name} failed on task {task.task_id} sample {k}: {e}") from e
        traj.set_id(f"{task.task_id}#{k}")
        if score:
            traj.reward = await score_trajectory(spec, task, traj)
        if on_done is not None:
            on_done(task, traj)
        fault_point("trajectory")  # tests only: MEMRL_FAULT_AT=trajectory@k kills mid-rollout
        return traj

    results = await asyncio.gather(*(one(t, k) for t in tasks for k in range(n)))
    return [Group(t.task_id, list(results[i * n : (i + 1) * n])) for i, t in enumerate(tasks)]


def rollout_sync(*args: Any, **kwargs: Any) -> list[Group]:
    """`rollout` for synchronous callers (scripts, the trainer)."""
    return asyncio.run(rollout(*args, **kwargs))
