"""memrl.engines.versioned (asynchronous training's gate) and memrl.training.step.async_rollout.stale_filter:
a weight sync between a trajectory's calls, in both partial-rollout modes; the versions segments carry;
the staleness filter's counts. Everything here is hand-scripted: an engine whose calls block until the
test lets them go, a workflow of three calls, the sync driven by the test on the same event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from memrl.engines.base import Completion
from memrl.engines.versioned import VERSION_KEY, VersionedEngine
from memrl.training.step.async_rollout import partial_metrics, stale_filter
from memrl.types import Group, Segment, Task, Trajectory
from memrl.workflows import WorkflowSpec
from memrl.workflows.rollouts import rollout


@dataclasses.dataclass
class NoConfig:
    pass


class HeldEngine:
    """Each call returns token 7 once the test releases it (`release()`); counts its calls."""

    tokenizer = None

    def __init__(self) -> None:
        self.calls = 0
        self.waiting: list[asyncio.Event] = []

    async def generate(self, prompt_ids, sampling) -> Completion:
        self.calls += 1
        ev = asyncio.Event()
        self.waiting.append(ev)
        await ev.wait()
        return Completion([7], [-0.5], "stop")

    def release(self) -> None:
        for ev in self.waiting:
            ev.set()
        self.waiting = []


async def _three_calls(task: Task, engine, cfg, rng: random.Random) -> Trajectory:
    """Three calls; the first two segments copy their call's version (as memrl.workflows.chunked does),
    the third does not (the runner labels it with the trajectory's oldest version)."""
    segs = []
    for i in range(3):
        out = await engine.generate([1, 2], None)
        info = {VERSION_KEY: out.info[VERSION_KEY]} if i < 2 else {}
        segs.append(Segment([1, 2], list(out.token_ids), list(out.logprobs), step=i, info=info))
    return Trajectory(task.task_id, "", segs)


SPEC = WorkflowSpec("three_calls", _three_calls, NoConfig, lambda task, traj: 0.0)


async def _until(cond, what: str) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def _sync_after_first_call(mode: str, max_aborts: int = 1) -> tuple[Group, HeldEngine, VersionedEngine, int]:
    """One trajectory: its first call runs under version 0, then a sync (pause -> version 1 -> resume)
    while the trajectory is between calls; then every call is released as it comes."""
    held = HeldEngine()
    gate = VersionedEngine(held, version=0, abort=mode == "abort", max_aborts=max_aborts)
    job = asyncio.ensure_future(rollout([Task("t", "q", "c", ["a"])], SPEC, gate, {}, n=1, score=False, services=None))
    await _until(lambda: len(held.waiting) == 1, "the first call")
    pausing = asyncio.ensure_future(gate.pause())
    await asyncio.sleep(0)
    assert not pausing.done()  # a call in flight: the sync waits for it
    held.release()  # the first call finishes on version 0
    await pausing
    assert gate._open.is_set() is False
    marked = await gate.resume(1)
    while not job.done():
        held.release()
        await asyncio.sleep(0)
    groups = job.result()
    return groups[0], held, gate, marked


def _versions(traj: Trajectory) -> list[int]:
    return [s.info[VERSION_KEY] for s in traj.segments]


def test_continue_keeps_each_segments_version():
    group, held, _, marked = asyncio.run(_sync_after_first_call("continue"))
    traj = group.trajectories[0]
    # call 1 under version 0, calls 2 and 3 under version 1; segment 3 copies nothing and gets the
    # trajectory's oldest version (0): conservative, never newer than the truth
    assert _versions(traj) == [0, 1, 0]
    assert held.calls == 3 and marked == 0 and traj.metrics["aborts"] == 0
    assert partial_metrics([group]) == {"async/partial_trajectories": 1.0}


def test_abort_resamples_the_trajectory_on_the_new_weights():
    group, held, _, marked = asyncio.run(_sync_after_first_call("abort"))
    traj = group.trajectories[0]
    # the first attempt made 1 call (version 0) and was aborted at its second; the second attempt's 3
    # calls all ran under version 1
    assert marked == 1 and held.calls == 4
    assert _versions(traj) == [1, 1, 1] and traj.metrics["aborts"] == 1
    assert partial_metrics([group]) == {"async/partial_trajectories": 0.0}


def test_abort_is_bounded_per_trajectory():
    group, held, _, marked = asyncio.run(_sync_after_first_call("abort", max_aborts=0))
    assert marked == 0 and held.calls == 3 and _versions(group.trajectories[0]) == [0, 1, 0]


def test_a_call_during_a_sync_waits_for_the_new_version():
    async def go() -> list[int]:
        held = HeldEngine()
        gate = VersionedEngine(held, version=4)
        await gate.pause()
        call = asyncio.ensure_future(gate.generate([1], None))
        await asyncio.sleep(0)
        assert held.calls == 0  # the gate is closed: the call has not reached the engine
        await gate.resume(5)
        await _until(lambda: held.calls == 1, "the call after resume")
        held.release()
        out = await call
        return [out.info[VERSION_KEY], gate.version]

    assert asyncio.run(go()) == [5, 5]


def test_plain_engine_rollout_labels_nothing():
    """Without the gate (the synchronous loop) segments get no version: the trajectories are as before."""
    class Plain:
        tokenizer = None

        async def generate(self, prompt_ids, sampling):
            return Completion([7], [-0.5], "stop")

    async def no_version(task, engine, cfg, rng):
        out = await engine.generate([1], None)
        return Trajectory(task.task_id, "", [Segment([1], list(out.token_ids), list(out.logprobs))])

    spec = WorkflowSpec("plain", no_version, NoConfig, lambda task, traj: 0.0)
    groups = asyncio.run(rollout([Task("t", "q", "c", ["a"])], spec, Plain(), {}, n=2, score=False, services=None))
    for t in groups[0].trajectories:
        assert VERSION_KEY not in t.segments[0].info and "aborts" not in t.metrics


def _seg(version: int | None) -> Segment:
    return Segment([1], [2], [-0.1], info={} if version is None else {VERSION_KEY: version})


def test_stale_filter_counts_and_drops_by_hand():
    # updating the policy of version 3 with max_staleness 1: ages 0, 1, 2, 0 (unlabelled), 3
    per_group = [[_seg(3), _seg(2)], [_seg(1), _seg(None), _seg(0)]]
    kept, m = stale_filter(per_group, step=3, max_staleness=1)
    assert [[s.info.get(VERSION_KEY) for s in g] for g in kept] == [[3, 2], [None]]
    assert m == {"async/stale_dropped": 2.0, "async/staleness_mean": pytest.approx(1 / 3),
                 "async/staleness_max": 1.0, "async/policy_version": 3.0}
    kept, m = stale_filter(per_group, step=3, max_staleness=3)
    assert sum(len(g) for g in kept) == 5 and m["async/stale_dropped"] == 0.0 and m["async/staleness_max"] == 3.0
    assert m["async/staleness_mean"] == pytest.approx((0 + 1 + 2 + 0 + 3) / 5)
