"""The `keyword` retriever (workflow.retriever_kind=keyword): an in-memory word-overlap ranking of a
JSONL corpus, for small corpora and tests (no index to build, no dependency). BM25
(memrl.services.retrieval) is the one to use for real corpora."""

from __future__ import annotations

import asyncio
import json
import re

from memrl.services.base import Document, Hit


class KeywordRetriever:
    """An in-memory Retriever: documents ranked by how many distinct query words they contain.

    Score = |words(query) & words(title + text)|, ties broken by corpus order; documents scoring 0 are
    left out. It keeps nothing per call (the test double in tests/doubles.py records calls).
    """

    def __init__(self, documents: list[Document]) -> None:
        self.documents = list(documents)
        self._words = [_words(f"{d.title} {d.text}") for d in self.documents]

    @classmethod
    def from_jsonl(cls, path: str) -> KeywordRetriever:
        """Documents from a JSONL file of {"id", "title", "text"} rows."""
        docs = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    docs.append(Document(str(rec["id"]), str(rec.get("title", "")), str(rec["text"])))
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}: line {lineno} is not a corpus row with id and text: {e}") from e
        return cls(docs)

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        await asyncio.sleep(0)
        return self.rank(queries, topk)

    def rank(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """The hits of each query (what `retrieve` returns), computed at once."""
        out = []
        for q in queries:
            qw = _words(q)
            scored = [(len(qw & w), -i) for i, w in enumerate(self._words)]
            best = sorted((s for s in scored if s[0] > 0), reverse=True)[:topk]
            out.append([Hit(self.documents[-i], float(s)) for s, i in best])
        return out

    async def close(self) -> None:
        return None


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))
