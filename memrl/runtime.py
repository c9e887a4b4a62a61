"""The rollout runtime: one per run (`memrl train`, `memrl eval`, in-training validation), closed once.

A `RolloutRuntime` owns ONE event loop for the whole run (`asyncio.Runner`), the engine and the run's
`Services` (the retriever and LLM-judge clients a workflow config names). Everything loop-bound (httpx
clients, semaphores) is made on that loop once and closed by `close()`; nothing is cached per loop in a
module. The stages of a rollout are methods:

    sample(tasks, n, seed) -> groups        generation only (workflow.run), no rewards
    score(groups) -> scores                  outcome and step rewards (spec.reward, spec.step_rewards),
                                             RETURNED as memrl.workflows.rollouts.Score per trajectory

`memrl.workflows.rollouts.apply_scores` writes a step's scores onto its trajectories (reward, metrics,
info, `Segment.step_reward`) in one place; the advantage estimators read the returned step rewards.

    with RolloutRuntime(engine, spec, wf_cfg) as rt:
        groups = rt.sample(tasks, n=4, seed=0)
        scores = rt.score(groups)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from memrl.services.session import Services
from memrl.types import Group, Task, Trajectory
from memrl.workflows.rollouts import rollout, score_groups

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["RolloutRuntime", "rollout_once"]


async def _cancel_others() -> None:
    """Cancel every task of the running loop but the caller's, and wait for them to end."""
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me]
    for t in others:
        t.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class RolloutRuntime:
    """One event loop, one engine and one `Services` for a whole run; a context manager.

    `spec` / `cfg`: the run's workflow (memrl.workflows.WorkflowSpec) and its config; `sample` may be
    given another config of the same workflow (validation samples at its own temperature). `close_engine`:
    whether `close()` closes the engine too (False when the caller owns it)."""

    def __init__(self, engine: Any, spec: Any = None, cfg: Any = None, concurrency: int = 64,
                 services: Services | None = None, close_engine: bool = True, background: bool = False) -> None:
        self.engine, self.spec, self.cfg, self.concurrency = engine, spec, cfg, concurrency
        self.services = services if services is not None else Services()
        self.close_engine = close_engine
        self._runner: asyncio.Runner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if background:  # asynchronous training: the loop runs on its own thread while the caller trains
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="memrl-rollout", daemon=True)
            self._thread.start()
        else:
            self._runner = asyncio.Runner()

    # ------------------------------------------------------------------ the loop
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` to completion on the runtime's event loop (the same loop every call); with
        `background`, from any other thread (the caller blocks until it is done)."""
        if self.closed:
            coro.close()
            raise RuntimeError("RolloutRuntime: used after close()")
        if self._runner is not None:
            return self._runner.run(coro)
        return self.submit(coro).result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """background=True: start `coro` on the runtime's loop and return at once (a thread-safe future)."""
        if self._loop is None or self.closed:
            coro.close()
            raise RuntimeError("RolloutRuntime.submit needs a background runtime that is not closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self.closed:
            raise RuntimeError("RolloutRuntime: used after close()")
        if self._runner is not None:
            return self._runner.get_loop()
        assert self._loop is not None
        return self._loop

    # ------------------------------------------------------------------ the stages
    def sample(self, tasks: Sequence[Task], n: int, seed: int, *, cfg: Any = None, spec: Any = None,
               on_done: Callable[[Task, Trajectory], None] | None = None, score: bool = False,
               concurrency: int | None = None) -> list[Group]:
        """n trajectories per task through the engine (memrl.workflows.rollouts.rollout): one Group per task,
        in task order, each carrying its Task; no rewards yet, or with `score` each trajectory scored (and
        its score applied) as soon as it is done, before `on_done` (evaluation streams its rows so).
        `concurrency`: the most trajectories in flight for this call (default: the runtime's)."""
        return self.run(self.asample(tasks, n, seed, cfg=cfg, spec=spec, on_done=on_done, score=score,
                                     concurrency=concurrency))

    async def asample(self, tasks: Sequence[Task], n: int, seed: int, *, cfg: Any = None, spec: Any = None,
                      on_done: Callable[[Task, Trajectory], None] | None = None, engine: Any = None,
                      score: bool = False, concurrency: int | None = None) -> list[Group]:
        """`sample` as a coroutine on the runtime's loop; `engine`: another engine than the runtime's (the
        asynchronous producer's memrl.engines.versioned.VersionedEngine around it)."""
        spec = spec or self.spec
        if spec is None:
            raise ValueError("RolloutRuntime.sample: no workflow (give spec= here or to the runtime)")
        return await rollout(tasks, spec, engine if engine is not None else self.engine,
                             cfg if cfg is not None else self.cfg, n=n, seed=seed, on_done=on_done, score=score,
                             concurrency=concurrency if concurrency is not None else self.concurrency,
                             services=self.services)

    def score(self, groups: Sequence[Group], *, spec: Any = None) -> list[list[Any]]:
        """The Score (memrl.workflows.rollouts.Score) of every trajectory, `[group][trajectory]`; nothing is
        written onto the trajectories (memrl.workflows.rollouts.apply_scores does that)."""
        return self.run(self.ascore(groups, spec=spec))

    async def ascore(self, groups: Sequence[Group], *, spec: Any = None) -> list[list[Any]]:
        """`score` as a coroutine on the runtime's loop."""
        spec = spec or self.spec
        if spec is None:
            raise ValueError("RolloutRuntime.score: no workflow (give spec= here or to the runtime)")
        return await score_groups(spec, groups, self.services)

    # ------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return self._runner is None and self._loop is None

    def close(self) -> None:
        """Close the services' clients, then the engine (when owned), then the loop; idempotent. A
        background loop's unfinished tasks (a rollout producer) are cancelled first."""
        if self.closed:
            return
        try:
            if self._loop is not None:
                self.run(_cancel_others())
            self.run(self.services.aclose())
            close = getattr(self.engine, "close", None) if self.close_engine else None
            if close is not None:
                self.run(close())
        finally:
            runner, loop, thread = self._runner, self._loop, self._thread
            self._runner = self._loop = self._thread = None
            if runner is not None:
                runner.close()
            if loop is not None and thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join()
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

    def __enter__(self) -> RolloutRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rollout_once(tasks: Sequence[Task], spec: Any, engine: Any, cfg: Any, n: int = 1, seed: int = 0,
                 concurrency: int = 64) -> list[Group]:
    """A one-off scored rollout (demonstrations, scripts, tests): `tasks` x n through `engine` on a
    RolloutRuntime of its own, each trajectory scored as it finishes; the engine stays open."""
    with RolloutRuntime(engine, spec, cfg, concurrency=concurrency, close_engine=False) as rt:
        return rt.sample(tasks, n, seed, score=True)
