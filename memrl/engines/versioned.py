"""Policy versions for asynchronous training (`rollout.max_staleness > 0`, docs/guides/async.md).

`VersionedEngine` wraps the run's engine for the rollout producer. Every `generate` call runs under one
policy version (the number of weight syncs since step 0: version v = the weights after v updates): a
weight sync first `pause()`s the gate (no new call starts, the calls in flight finish on the old weights),
then loads the weights, then `resume(v)`s. Each completion carries `info["policy_version"]`, and the
trajectory's calls are logged in a `CallLog` (a context variable the rollout runner sets per trajectory):
a segment's version is the one its call ran under (memrl.workflows.chunked.call_segment), else the oldest
of its trajectory's calls (`stamp_versions`, a conservative label: never newer than the truth).

Partial rollouts: a trajectory in flight across a sync either continues on the new weights (its later
segments carry the newer version; `rollout.partial=continue`) or, with `rollout.partial=abort`, its next
call raises `RolloutAborted` and the runner samples it again from the start on the new weights, at most
`rollout.partial_max_aborts` times per trajectory (then it continues).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from typing import Any

from memrl.engines.base import SamplingParams

VERSION_KEY = "policy_version"
"""The key of the version in Completion.info and Segment.info."""


class RolloutAborted(BaseException):
    """A trajectory was aborted by a weight sync (rollout.partial=abort); the runner resamples it. A
    BaseException (like asyncio.CancelledError), so a workflow's own `except Exception` never swallows it."""


@dataclasses.dataclass
class CallLog:
    """The versions of one trajectory's calls, in order; `abortable`: may a sync still abort it."""

    versions: list[int] = dataclasses.field(default_factory=list)
    abortable: bool = False
    aborted: bool = False


CALLS: contextvars.ContextVar[CallLog | None] = contextvars.ContextVar("memrl_calls", default=None)
"""The running trajectory's CallLog (set by memrl.workflows.rollouts.rollout in each trajectory's task)."""


def stamp_versions(segments: list[Any], log: CallLog | None) -> None:
    """Give every segment without a version the oldest version of its trajectory's calls (no-op when
    the trajectory made no versioned call: a synchronous run's segments stay as they were)."""
    if log is None or not log.versions:
        return
    oldest = min(log.versions)
    for s in segments:
        s.info.setdefault(VERSION_KEY, oldest)


def segment_version(segment: Any) -> int | None:
    v = segment.info.get(VERSION_KEY)
    return int(v) if v is not None else None


class VersionedEngine:
    """The engine behind a gate that a weight sync closes (module docstring). Lives on the runtime's
    event loop: `generate`, `pause` and `resume` are called there."""

    def __init__(self, engine: Any, version: int = 0, abort: bool = False, max_aborts: int = 1) -> None:
        self.engine = engine
        self.version = version
        self.abort = abort
        self.max_aborts = max_aborts
        """rollout.partial_max_aborts: times one trajectory may be aborted and resampled."""
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inflight = 0
        self._live: dict[int, CallLog] = {}  # trajectories with a call made and not yet done
        self.changed = asyncio.Condition()
        """Notified after every resume (the producer waits on it for the staleness bound)."""

    def __getattr__(self, name: str) -> Any:  # tokenizer, settings, ... of the wrapped engine
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Any:
        log = CALLS.get()
        while not self._open.is_set():
            await self._open.wait()
        if log is not None and log.aborted:
            raise RolloutAborted
        v = self.version
        self._inflight += 1
        self._idle.clear()
        try:
            out = await self.engine.generate(prompt_ids, sampling)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        out.info = {**out.info, VERSION_KEY: v}
        if log is not None:
            log.versions.append(v)
            self._live[id(log)] = log
        return out

    def done(self, log: CallLog) -> None:
        """The trajectory of `log` finished (or failed): a sync no longer concerns it."""
        self._live.pop(id(log), None)

    async def pause(self) -> None:
        """Close the gate and wait until no call is in flight."""
        self._open.clear()
        await self._idle.wait()

    async def resume(self, version: int) -> int:
        """The engine now serves `version`: with abort, mark the live trajectories that sampled from an
        older one (and may still be aborted); open the gate. Returns how many were marked."""
        self.version = version
        marked = 0
        if self.abort:
            for log in list(self._live.values()):
                if log.abortable and log.versions and min(log.versions) < version:
                    log.aborted = True
                    marked += 1
                    self._live.pop(id(log), None)
        self._open.set()
        async with self.changed:
            self.changed.notify_all()
        return marked
