"""The retrieval contract shared by the in-process retriever, the HTTP client and MemAct's search tool.

Both `memrl.services.retrieval.BM25Retriever` (in-process) and `memrl.services.client.HTTPRetriever`
(`POST /retrieve` of `memrl serve retrieval`) satisfy `Retriever`, so tools and tests need no server.
`Document` (one corpus passage) is memrl.types.Document, importable from here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from memrl.types import Document


class RetrievalError(RuntimeError):
    """A retrieval call failed; the message names the endpoint (or the in-process retriever) and why."""


@dataclass(frozen=True)
class Hit:
    """One retrieved document with its score (higher is better)."""

    document: Document
    score: float


class Retriever(Protocol):
    """`retrieve(queries, topk)` -> one ranked list of at most `topk` hits per query, in query order."""

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]: ...

    async def close(self) -> None: ...
