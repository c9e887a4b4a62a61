"""Retrieval over one task's own document (InfMem's retrieve action): the document is cut into passages
of `passage_tokens` tokens, and a query is answered by BM25 over those passages, behind the same
`Retriever` interface (memrl.services.base) as the corpus retrievers.

Three scorers:
- `bm25s`: memrl's BM25Retriever (Lucene BM25 via bm25s, \\w+ word tokens, English stopwords removed; only
  passages with a positive score come back).
- `okapi`: BM25 Okapi as rank_bm25's BM25Okapi computes it, over words: passages and query lower-cased and
  split on whitespace, k1 = 1.5, b = 0.75; idf = ln(N - n + 0.5) - ln(n + 0.5), and a term whose idf is
  negative gets epsilon (0.25) times the mean idf instead; every passage is ranked, zero scores included,
  so a query always gets `topk` passages (ties: document order).
- `okapi_published`: what the released InfMem code (recurrent/impls/infmem.py) actually builds: it hands
  BM25Okapi the passages as untokenized strings, so a passage's terms are its characters (case kept)
  while the query's terms are lower-cased whitespace words; only one-character query words can match.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memrl.services.base import Hit, RetrievalError

# bm25s through memrl.services.retrieval, which keeps jax (if installed) off the GPU before bm25s loads it
from memrl.services.retrieval import STOPWORDS_EN, BM25Retriever, tokenize
from memrl.types import Document

SCORERS: tuple[str, ...] = ("bm25s", "okapi", "okapi_published")


_STOPWORDS = frozenset(STOPWORDS_EN)


@dataclass(frozen=True)
class Passage:
    """One passage of a document: its text and the token span [start, end) it was cut from."""

    text: str
    start: int
    end: int


def cut_passages(context_ids: Sequence[int], tokenizer: Any, passage_tokens: int) -> list[Passage]:
    """Contiguous, non-overlapping passages of `passage_tokens` tokens (the last may be shorter), each
    decoded on its own (InfMem: retrieve_chunk_size 500 over the same ids the chunks are cut from)."""
    if passage_tokens < 1:
        raise ValueError(f"passage_tokens must be >= 1, got {passage_tokens}")
    out = []
    for s in range(0, len(context_ids), passage_tokens):
        e = min(len(context_ids), s + passage_tokens)
        out.append(Passage(tokenizer.decode(list(context_ids[s:e])), s, e))
    return out


class OkapiBM25:
    """BM25 Okapi with rank_bm25's rules (see the module docstring); pure Python, for a document's few
    hundred passages."""

    def __init__(self, texts: Sequence[str], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25,
                 terms: str = "words") -> None:
        if not texts:
            raise RetrievalError("OkapiBM25: the document has no passages")
        if terms not in ("words", "chars"):
            raise ValueError(f"terms must be words or chars, got {terms!r}")
        self.k1, self.b = k1, b
        # chars: a passage's terms are its characters, as rank_bm25 iterates an untokenized string
        self.docs = [Counter(t) if terms == "chars" else Counter(t.lower().split()) for t in texts]
        self.lengths = [sum(c.values()) for c in self.docs]
        self.avgdl = sum(self.lengths) / len(self.docs)
        df: Counter[str] = Counter()
        for c in self.docs:
            df.update(c.keys())
        n = len(self.docs)
        idf = {w: math.log(n - f + 0.5) - math.log(f + 0.5) for w, f in df.items()}
        floor = epsilon * (sum(idf.values()) / len(idf)) if idf else 0.0
        self.idf = {w: (floor if v < 0 else v) for w, v in idf.items()}

    def scores(self, query: str) -> list[float]:
        """One score per passage for the lower-cased, whitespace-split query (repeated words count again)."""
        out = [0.0] * len(self.docs)
        for w in query.lower().split():
            idf = self.idf.get(w, 0.0)
            for i, c in enumerate(self.docs):
                tf = c.get(w, 0)
                denom = tf + self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avgdl) if self.avgdl else 1.0
                out[i] += idf * tf * (self.k1 + 1) / denom if denom else 0.0
        return out


class DocumentRetriever:
    """BM25 over one document's passages; satisfies memrl.services.base.Retriever. Document ids are the
    passage numbers ("p0", "p1", ...), the title empty."""

    def __init__(self, passages: Sequence[Passage], scorer: str = "bm25s") -> None:
        if scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {', '.join(SCORERS)}, got {scorer!r}")
        self.passages = list(passages)
        self.scorer = scorer
        self.docs = [Document(f"p{i}", "", p.text) for i, p in enumerate(self.passages)]
        self._okapi: OkapiBM25 | None = None
        self._bm25s: Any = None
        if self.docs and scorer in ("okapi", "okapi_published"):
            self._okapi = OkapiBM25([d.text for d in self.docs], terms="chars" if scorer == "okapi_published" else "words")
        elif self.docs:
            # a document of stopwords only has no index (bm25s cannot build one): no query finds anything
            if any(tokenize(d.text, _STOPWORDS) for d in self.docs):
                self._bm25s = BM25Retriever(self.docs)

    def search_one(self, query: str, topk: int) -> list[Hit]:
        if topk < 1:
            raise RetrievalError(f"topk must be >= 1, got {topk}")
        if self._okapi is None and self._bm25s is None:
            return []
        if self._okapi is not None:
            scores = self._okapi.scores(query)
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:topk]
            return [Hit(self.docs[i], scores[i]) for i in order]
        return self._bm25s.search_one(query, min(topk, len(self.docs)))

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        return [self.search_one(q, topk) for q in queries]

    async def close(self) -> None:
        return None
