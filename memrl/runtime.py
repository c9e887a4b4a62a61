"""The rollout runtime: one per run (`memrl train`, `memrl eval`, in-training validation), closed once.

A `RolloutRuntime` owns ONE event loop for the whole run (`asyncio.Runner`), the engine and the run's
`Services` (the retriever and LLM-judge clients a workflow config names). Everything loop-bound (httpx
clients, semaphores) is made on that loop once and closed by `close()`; nothing is cached per loop in a
module. The stages of a rollout are methods:

    sample(tasks, n, seed) -> groups        generation only (workflow.run), no rewards
    score(groups) -> scores                  outcome and step rewards (spec.reward, spec.step_rewards),
                                             RETURNED as memrl.workflows.runner.Score per trajectory

`memrl.workflows.runner.apply_scores` writes a step's scores onto its trajectories (reward, metrics,
info, `Segment.step_reward`) in one place; the advantage estimators read the returned step rewards.

    with RolloutRuntime(engine, spec, wf_cfg) as rt:
        groups = rt.sample(tasks, n=4, seed=0)
        scores = rt.score(groups)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from memrl.services.session import Services
from memrl.types import Group, Task, Trajectory

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["RolloutRuntime", "Services"]


class RolloutRuntime:
    """One event loop, one engine and one `Services` for a whole run; a context manager.

    `spec` / `cfg`: the run's workflow (memrl.workflows.WorkflowSpec) and its config; `sample` may be
    given another config of the same workflow (validation samples at its own temperature). `close_engine`:
    whether `close()` closes the engine too (False when the caller owns it)."""

    def __init__(self, engine: Any, spec: Any = None, cfg: Any = None, concurrency: int = 64,
                 services: Services | None = None, close_engine: bool = True) -> None:
        self.engine, self.spec, self.cfg, self.concurrency = engine, spec, cfg, concurrency
        self.services = services if services is not None else Services()
        self.close_engine = close_engine
        self._runner: asyncio.Runner | None = asyncio.Runner()

    # ------------------------------------------------------------------ the loop
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` to completion on the runtime's event loop (the same loop every call)."""
        if self._runner is None:
            coro.close()
            raise RuntimeError("RolloutRuntime: used after close()")
        return self._runner.run(coro)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._runner is None:
            raise RuntimeError("RolloutRuntime: used after close()")
        return self._runner.get_loop()

    # ------------------------------------------------------------------ the stages
    def sample(self, tasks: Sequence[Task], n: int, seed: int, *, cfg: Any = None, spec: Any = None,
               on_done: Callable[[Task, Trajectory], None] | None = None) -> list[Group]:
        """n trajectories per task through the engine (memrl.workflows.runner.rollout, score=False):
        one Group per task, in task order, each carrying its Task; no rewards yet."""
        from memrl.workflows.runner import rollout

        spec = spec or self.spec
        if spec is None:
            raise ValueError("RolloutRuntime.sample: no workflow (give spec= here or to the runtime)")
        return self.run(rollout(tasks, spec, self.engine, cfg if cfg is not None else self.cfg, n=n,
                                concurrency=self.concurrency, seed=seed, on_done=on_done, score=False,
                                services=self.services))

    def score(self, groups: Sequence[Group], *, spec: Any = None) -> list[list[Any]]:
        """The Score (memrl.workflows.runner.Score) of every trajectory, [group][trajectory]; nothing is
        written onto the trajectories (memrl.workflows.runner.apply_scores does that)."""
        from memrl.workflows.runner import score_groups

        spec = spec or self.spec
        if spec is None:
            raise ValueError("RolloutRuntime.score: no workflow (give spec= here or to the runtime)")
        return self.run(score_groups(spec, groups, self.services))

    # ------------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return self._runner is None

    def close(self) -> None:
        """Close the services' clients, then the engine (when owned), then the loop; idempotent."""
        if self._runner is None:
            return
        runner = self._runner
        try:
            runner.run(self.services.aclose())
            close = getattr(self.engine, "close", None) if self.close_engine else None
            if close is not None:
                runner.run(close())
        finally:
            self._runner = None
            runner.close()

    def __enter__(self) -> RolloutRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
