"""The retrieval contract shared by the in-process retriever, the HTTP client and MemAct's search tool.

Both `memrl.services.retrieval.BM25Retriever` (in-process) and `memrl.services.client.HTTPRetriever`
(`POST /retrieve` of `memrl serve retrieval`) satisfy `Retriever`, so tools and tests need no server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class RetrievalError(RuntimeError):
    """A retrieval call failed; the message names the endpoint (or the in-process retriever) and why."""


@dataclass(frozen=True)
class Document:
    """One corpus passage: `id` is stable across runs, `title` may be empty."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    """One retrieved document with its score (higher is better)."""

    document: Document
    score: float


class Retriever(Protocol):
    """`retrieve(queries, topk)` -> one ranked list of at most `topk` hits per query, in query order."""

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]: ...

    async def close(self) -> None: ...
