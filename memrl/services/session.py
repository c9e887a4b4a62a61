"""The clients one run's workflows and rewards use (memrl.runtime.RolloutRuntime owns one `Services`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from memrl.rewards.judge import JudgeClient, JudgeSettings
from memrl.services import registry

log = logging.getLogger(__name__)


class Services:
    """The clients a run's workflows and rewards use, built on first use and owned until `aclose()`.

    `retriever(kind, corpus, url)`: one retriever per source for the run (an HTTP one is owned and closed
    here; in-process ones come from memrl.services.registry.build_retriever). `judge(settings)`: one
    memrl.rewards.judge.JudgeClient per judge setting. Workflows receive this object as their `services`
    argument; nothing keeps clients in module caches."""

    def __init__(self) -> None:
        self._retrievers: dict[tuple[Any, ...], Any] = {}
        self._judges: dict[tuple[Any, ...], Any] = {}
        self._owned: list[Any] = []  # objects with an async close(), closed by aclose()
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Services: used after close()")

    def retriever(self, kind: str, corpus: str | None, url: str | None) -> Any:
        """The retriever for (kind, corpus, url) (memrl.services.registry.build_retriever), built once per run."""
        self._check_open()
        key = ("url", url) if url else (kind, corpus)
        if key not in self._retrievers:
            r = registry.build_retriever(kind, corpus, url)
            self._retrievers[key] = r
            if url:  # a client this run made; registered / corpus retrievers are not ours to close
                self._owned.append(r)
        return self._retrievers[key]

    def judge(self, settings: Any) -> Any:
        """The JudgeClient for `settings` (memrl.rewards.judge.JudgeSettings, or its fields as a dict),
        built once per run."""
        self._check_open()
        fields = dict(settings) if isinstance(settings, dict) else dataclasses.asdict(settings)
        key = tuple(sorted(fields.items()))
        if key not in self._judges:
            client = JudgeClient(JudgeSettings(**fields))
            self._judges[key] = client
            self._owned.append(client)
        return self._judges[key]

    async def aclose(self) -> None:
        """Close every client this object made (each once); it cannot be used afterwards."""
        self.closed = True
        owned, self._owned = self._owned, []
        self._retrievers.clear()
        self._judges.clear()
        for obj in owned:
            try:
                await obj.close()
            except Exception as e:  # noqa: BLE001 - closing the rest matters more than one failure
                log.warning("closing %s failed: %s: %s", type(obj).__name__, type(e).__name__, e)


T = TypeVar("T")


async def run_with(services: Services | None, body: Callable[[Services], Awaitable[T]]) -> T:
    """`body(services)`: the run's Services, or (None) a Services for this call alone, closed after it."""
    if services is not None:
        return await body(services)
    own = Services()
    try:
        return await body(own)
    finally:
        await own.aclose()
