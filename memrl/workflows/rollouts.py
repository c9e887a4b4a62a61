"""Run a workflow over tasks x n samples concurrently, through one engine, into Groups; score them.

The stages memrl.runtime.RolloutRuntime calls: `rollout` (sample; with score=True each trajectory is also
scored as it finishes) and `score_groups` (score, returning memrl.types.Score per trajectory);
`apply_scores` writes scores onto trajectories. Every rollout runs on a RolloutRuntime's loop with its
services.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from memrl.engines.base import Engine
from memrl.engines.versioned import CALLS, CallLog, RolloutAborted, VersionedEngine, stamp_versions
from memrl.errors import UserError, fault_point
from memrl.types import Group, Score, Task, Trajectory
from memrl.workflows import WorkflowSpec

log = logging.getLogger(__name__)


class RolloutError(RuntimeError):
    """A workflow failed on one task; the message names the task and sample."""


def takes_services(fn: Callable[..., Any]) -> bool:
    """Whether a workflow's run / reward function takes the run's services (a `services` parameter)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "services" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


async def score_trajectory(spec: WorkflowSpec, task: Task, traj: Trajectory, services: Any = None) -> Score:
    """The score stage for one trajectory: spec.reward (plain or async; a float or a Score) and
    spec.step_rewards, RETURNED (nothing is written onto `traj`; `apply_scores` does that).

    A failing reward is logged and scores 0 with `metrics["reward_error"] = 1.0`; failing step rewards
    are logged, left None and counted the same way."""
    try:
        value = spec.reward(task, traj, services=services) if takes_services(spec.reward) else spec.reward(task, traj)
        if inspect.isawaitable(value):
            value = await value
        score = value if isinstance(value, Score) else Score(float(value))
    except Exception as e:  # noqa: BLE001 - a reward service may fail in any way; never crash the run
        log.warning("reward of %s failed on task %s: %s: %s", spec.name, task.task_id, type(e).__name__, e)
        score = Score(0.0, metrics={"reward_error": 1.0})
    if spec.step_rewards is not None:
        try:
            steps = list(spec.step_rewards(task, traj))
            if len(steps) != len(traj.segments):
                raise ValueError(f"{len(steps)} step rewards for {len(traj.segments)} segments")
            score.step_rewards = steps
        except Exception as e:  # noqa: BLE001 - as for the outcome reward
            log.warning("step rewards of %s failed on task %s: %s: %s", spec.name, task.task_id,
                        type(e).__name__, e)
            score.metrics["reward_error"] = 1.0
    return score


async def score_groups(spec: WorkflowSpec, groups: Sequence[Group], services: Any = None) -> list[list[Score]]:
    """The score stage for a batch: one Score per trajectory, `[group][trajectory]`, in order (judge calls
    run concurrently; each group needs its Task), then the spec's `batch_scores` over the whole batch."""
    jobs = []
    for g in groups:
        if g.task is None:
            raise ValueError(f"score: group {g.task_id} carries no Task (Group.task)")
        jobs.extend(score_trajectory(spec, g.task, t, services) for t in g.trajectories)
    flat = iter(await asyncio.gather(*jobs))
    scores = [[next(flat) for _ in g.trajectories] for g in groups]
    return spec.batch_scores(groups, scores) if spec.batch_scores is not None else scores


def apply_score(traj: Trajectory, score: Score) -> None:
    """Write one Score onto its trajectory: reward, metrics, info and each `Segment.step_reward` (kept on
    the segments for the records and the viewer; the advantage estimators take the returned values)."""
    traj.reward = score.reward
    traj.metrics.update(score.metrics)
    traj.info.update(score.info)
    if score.step_rewards is not None:
        for seg, r in zip(traj.segments, score.step_rewards, strict=True):
            seg.step_reward = r


def apply_scores(groups: Sequence[Group], scores: Sequence[Sequence[Score]]) -> None:
    """`apply_score` over a batch (`[group][trajectory]`, as score_groups returns)."""
    for g, per_group in zip(groups, scores, strict=True):
        for traj, score in zip(g.trajectories, per_group, strict=True):
            apply_score(traj, score)


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
    score: bool = False,
    *,
    services: Any,
) -> list[Group]:
    """n trajectories per task, at most `concurrency` in flight; one Group per task (carrying its Task),
    in task order. Trajectory ids are "<task_id>#<sample>".

    score=False (the default, as RolloutRuntime.sample's): generation only, the score stage comes after;
    score=True: each trajectory is scored as soon as it is done (score_trajectory + apply_score, before
    `on_done`). `services`: the run's memrl.services.session.Services, passed to
    workflows and rewards that take them. Callers go through memrl.runtime.RolloutRuntime (`sample`),
    which owns the event loop and the services.
    """
    if n < 1:
        raise ValueError(f"rollout: n must be >= 1, got {n}")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("rollout: task ids must be unique within a batch")
    sem = asyncio.Semaphore(max(1, concurrency))
    run_takes = takes_services(spec.run)
    gate = engine if isinstance(engine, VersionedEngine) else None  # asynchronous training only

    async def attempt(task: Task, k: int) -> Trajectory:
        try:
            rng = trajectory_rng(seed, task.task_id, k)
            return await (spec.run(task, engine, cfg, rng, services=services) if run_takes
                          else spec.run(task, engine, cfg, rng))
        except UserError:  # a config / data mistake (e.g. MemAct's retriever): one line, named already
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the task named
            raise RolloutError(f"workflow {spec.name} failed on task {task.task_id} sample {k}: {e}") from e

    async def versioned(task: Task, k: int) -> Trajectory:
        """Under a VersionedEngine: the trajectory's calls logged (its segments get their policy
        versions); aborted by a weight sync (rollout.partial=abort), it is sampled again from the start."""
        assert gate is not None
        aborts = 0
        while True:
            calls = CallLog(abortable=aborts < gate.max_aborts)
            CALLS.set(calls)  # this trajectory's task has its own context
            try:
                traj = await attempt(task, k)
            except RolloutAborted:
                aborts += 1
                continue
            finally:
                gate.done(calls)
            stamp_versions(traj.segments, calls)
            traj.metrics["aborts"] = aborts
            return traj

    async def one(task: Task, k: int) -> Trajectory:
        async with sem:
            traj = await (versioned(task, k) if gate is not None else attempt(task, k))
        traj.set_id(f"{task.task_id}#{k}")
        if score:
            apply_score(traj, await score_trajectory(spec, task, traj, services))
        if on_done is not None:
            on_done(task, traj)
        fault_point("trajectory")  # tests only: MEMRL_FAULT_AT=trajectory@k kills mid-rollout
        return traj

    results = await asyncio.gather(*(one(t, k) for t in tasks for k in range(n)))
    return [Group(t.task_id, list(results[i * n : (i + 1) * n]), t) for i, t in enumerate(tasks)]
