"""Asynchronous training's rollout producer (`rollout.max_staleness = k >= 1`, docs/guides/async.md).

One producer coroutine runs on the run's RolloutRuntime loop (a background thread) and samples the
batches of steps s, s+1, ... in order, each exactly as the synchronous loop would (sample -> score ->
dynamic sampling; the batch of step t with the seed of step t), through the VersionedEngine gate. It may
start the batch of step t only while t - v <= k, v the policy version the engine serves (v = the number
of updates so far), so at most k batches are ahead of the trainer and the queue is bounded: the producer
waits on the gate's `changed` condition until a sync lets it go on. A batch started at version >= t - k
holds segments of versions >= t - k, and the trainer updates the policy of version t with it: no segment
more than k versions old reaches the loss. The trainer still counts and drops any that would
(`stale_filter`), so the bound is checked, not assumed.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Callable, Iterator
from typing import Any

from memrl.engines.versioned import VersionedEngine, segment_version
from memrl.training.step.rollout import RolloutResult, asample_groups
from memrl.types import Group, Segment, Task

log = logging.getLogger(__name__)


class Producer:
    """Samples the batches of steps `start`..`steps`-1 ahead of the trainer (module docstring)."""

    def __init__(self, runtime: Any, gate: VersionedEngine, stream: Iterator[Task], position: int, *,
                 start: int, steps: int, max_staleness: int, batch_size: int, n: int,
                 seed_of: Callable[[int], int], dynamic_sampling: bool, max_refill_rounds: int) -> None:
        self.runtime, self.gate, self.stream, self.position = runtime, gate, stream, position
        self.start, self.steps, self.k = start, steps, max_staleness
        self.batch_size, self.n, self.seed_of = batch_size, n, seed_of
        self.dynamic_sampling, self.max_refill_rounds = dynamic_sampling, max_refill_rounds
        self.started = start  # steps whose batch has been started (the next one to start)
        self._results: dict[int, asyncio.Future[RolloutResult]] = {}
        self._task: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()  # the batches being sampled

    def _take_tasks(self, k: int) -> list[Task]:
        tasks = [next(self.stream) for _ in range(k)]
        self.position += k
        return tasks

    def _future(self, step: int) -> asyncio.Future[RolloutResult]:
        if step not in self._results:
            self._results[step] = asyncio.get_running_loop().create_future()
        return self._results[step]

    async def _produce(self) -> None:
        step, previous = self.start, None
        while step < self.steps:
            async with self.gate.changed:  # the staleness bound: wait for the trainer's syncs
                await self.gate.changed.wait_for(lambda s=step: s - self.gate.version <= self.k)
            if self.dynamic_sampling and previous is not None:  # refills draw tasks: one batch at a time
                await asyncio.wait([previous])
            self.started = step + 1
            previous = asyncio.get_running_loop().create_task(self._batch(step), name=f"memrl-batch-{step}")
            self._batches.add(previous)
            previous.add_done_callback(self._batches.discard)
            step += 1

    async def _batch(self, step: int) -> None:
        """Sample the batch of `step`; its first tasks are drawn before the first await, so batches
        take their tasks in step order and a checkpoint's data position is a prefix."""
        fut = self._future(step)
        end = self.position

        def take(k: int) -> list[Task]:  # the data position after this batch's last draw
            nonlocal end
            tasks = self._take_tasks(k)
            end = self.position
            return tasks

        try:
            res = await asample_groups(take, self.runtime, self.batch_size, self.n, seed=self.seed_of(step),
                                       dynamic_sampling=self.dynamic_sampling,
                                       max_refill_rounds=self.max_refill_rounds, engine=self.gate)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - the trainer waiting for this step gets the error
            if not fut.done():
                fut.set_exception(e)
            return
        res.end_position = end
        fut.set_result(res)

    def begin(self) -> None:
        """Start producing (on the runtime's loop)."""
        async def go() -> None:
            self._task = asyncio.get_running_loop().create_task(self._produce(), name="memrl-producer")

        self.runtime.run(go())

    async def take(self, step: int) -> RolloutResult:
        """The batch of `step` (waiting for it)."""
        res = await self._future(step)
        del self._results[step]
        return res

    def in_flight(self, trained: int) -> int:
        """Batches started (done or not) for steps after the `trained` ones: what a stop now discards."""
        return max(0, self.started - trained)


def stale_filter(per_group: list[list[Segment]], step: int, max_staleness: int
                 ) -> tuple[list[list[Segment]], dict[str, float]]:
    """The selected segments of each group minus any sampled more than `max_staleness` versions before
    `step` (the policy version this update starts from); async/* metrics over what trains."""
    kept: list[list[Segment]] = []
    ages: list[int] = []
    dropped = 0
    for segs in per_group:
        keep = []
        for s in segs:
            v = segment_version(s)
            age = step - v if v is not None else 0
            if age > max_staleness:
                dropped += 1
                continue
            ages.append(age)
            keep.append(s)
        kept.append(keep)
    metrics = {
        "async/stale_dropped": float(dropped),
        "async/staleness_mean": statistics.fmean(ages) if ages else 0.0,
        "async/staleness_max": float(max(ages, default=0)),
        "async/policy_version": float(step),
    }
    if dropped:
        log.warning("step %d: dropped %d segment(s) sampled more than rollout.max_staleness=%d versions ago",
                    step + 1, dropped, max_staleness)
    return kept, metrics


def partial_metrics(groups: list[Group]) -> dict[str, float]:
    """async/partial_trajectories: trajectories whose segments were sampled by more than one version."""
    n = 0
    for g in groups:
        for t in g.trajectories:
            if len({segment_version(s) for s in t.segments}) > 1:
                n += 1
    return {"async/partial_trajectories": float(n)}
