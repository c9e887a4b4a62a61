"""In-process BM25 retrieval over a corpus JSONL (`{"id", "title", "text"}` per line).

BM25 (Robertson & Zaragoza 2009, Lucene variant, k1=1.5, b=0.75) scored by `bm25s`, picked by
measurement on the 11,195-paragraph HotpotQA corpus: ~7k queries/s against rank_bm25's ~24 queries/s
(docs/guides/memact_services.md). Ranking is by score, ties broken by corpus order, so every caller (in-process,
the HTTP service, tests) gets the same lists. Dense retrieval is an optional extra (`DenseRetriever`).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Sequence

# bm25s imports jax when it is installed and runs a top-k on jax's default device while importing: with a
# CUDA build of jax that starts jax on the GPU, which preallocates 75% of its memory outside torch's
# allocator (an H200's GPU check: 106 GiB held after a MemAct run, and the next model out of memory).
# memrl scores BM25 with numpy and never uses jax, so unless the process already runs jax or the user named
# its platforms, jax stays on the CPU.
if "jax" not in sys.modules:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import bm25s  # noqa: E402  (after the jax platform default above)
import numpy as np  # noqa: E402
from bm25s.stopwords import STOPWORDS_EN  # noqa: E402

from memrl.data.corpus import load_corpus  # noqa: E402
from memrl.services.base import Document, Hit, RetrievalError  # noqa: E402

MAX_TOPK = 100  # the service's bound; the search tool allows 1..20
_WORD = re.compile(r"\w+")


def check_topk(topk: object, max_topk: int = MAX_TOPK) -> int:
    """topk as an int in 1..max_topk, else RetrievalError naming the value."""
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= max_topk:
        raise RetrievalError(f"topk must be an integer in 1..{max_topk}, got {topk!r}")
    return topk


def tokenize(text: str, stopwords: frozenset[str]) -> list[str]:
    """Lower-cased word tokens (Unicode \\w+), English stopwords removed."""
    return [w for w in _WORD.findall(text.lower()) if w not in stopwords]


class BM25Retriever:
    """BM25 over a list of documents (title and text indexed together); satisfies `Retriever`."""

    def __init__(self, docs: Sequence[Document], k1: float = 1.5, b: float = 0.75, max_topk: int = MAX_TOPK):
        if not docs:
            raise RetrievalError("BM25Retriever: the corpus is empty")
        self.docs = list(docs)
        self.max_topk = max_topk
        self._stop = frozenset(STOPWORDS_EN)
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(w, len(vocab)) for w in tokenize(f"{d.title} {d.text}", self._stop)]
               for d in self.docs]
        self._vocab = vocab
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        if vocab:  # a corpus of stopwords only has no terms: bm25s cannot index it, and no query matches it
            self._bm25.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **kw) -> BM25Retriever:
        """A retriever over a corpus JSONL (see memrl.data.corpus.load_corpus for its checks)."""
        return cls(load_corpus(path), **kw)

    def search_one(self, query: str, topk: int) -> list[Hit]:
        """The top `topk` documents with a positive score, best first (ties: corpus order)."""
        terms = [w for w in tokenize(query, self._stop) if w in self._vocab]
        if not terms:
            return []
        scores = self._bm25.get_scores(terms)
        k = min(topk, len(scores))
        cand = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        # ties at the cut: take every document scoring the k-th best score, then order by (score desc, index)
        kth = max(float(scores[cand].min()), 1e-30)
        cand = np.flatnonzero(scores >= kth)
        order = cand[np.lexsort((cand, -scores[cand]))][:k]
        return [Hit(self.docs[i], float(scores[i])) for i in order]

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Synchronous batch search; checks the arguments."""
        check_topk(topk, self.max_topk)
        if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
            raise RetrievalError("queries must be a list of strings")
        return [self.search_one(q, topk) for q in queries]

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        # On the event loop, not in a thread: a search (well under a millisecond) then finishes in a fixed
        # place of the loop's order, so concurrent rollouts reach the engine in the same waves on every run
        # (docs/CONTRACTS.md, determinism); a thread would return at a time-dependent point and reorder them.
        return self.search(queries, topk)

    async def close(self) -> None:
        return None


class DenseRetriever:
    """Dense retrieval (optional `dense` extra): sentence-transformers embeddings, L2-normalized, searched
    exactly by FAISS inner product (= cosine similarity); satisfies `Retriever`.

    `model` is a local sentence-transformers or HuggingFace model directory (a plain HF model gets
    sentence-transformers' default pooling for its architecture). Passages are embedded as "title\\ntext";
    ties are ordered as FAISS returns them.
    """

    def __init__(self, docs: Sequence[Document], model: str, batch_size: int = 64, device: str = "cpu",
                 max_topk: int = MAX_TOPK):
        try:
            import faiss  # noqa: PLC0415
            from sentence_transformers import SentenceTransformer  # noqa: PLC0415
        except ImportError as e:
            raise RetrievalError(
                f"dense retrieval needs the optional packages sentence-transformers and faiss-cpu (missing: "
                f"{e.name}); install them with pip install 'memrl[dense]', or use BM25Retriever"
            ) from e
        if not docs:
            raise RetrievalError("DenseRetriever: the corpus is empty")
        self.docs = list(docs)
        self.max_topk = max_topk
        self.batch_size = batch_size
        self._model = SentenceTransformer(model, device=device)
        emb = self._embed([f"{d.title}\n{d.text}" for d in self.docs])
        self._index = faiss.IndexFlatIP(emb.shape[1])
        self._index.add(emb)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], model: str, **kw) -> DenseRetriever:
        return cls(load_corpus(path), model, **kw)

    def _embed(self, texts: list[str]) -> np.ndarray:
        emb = self._model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(emb, dtype=np.float32)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Synchronous batch search; checks the arguments."""
        check_topk(topk, self.max_topk)
        if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
            raise RetrievalError("queries must be a list of strings")
        if not queries:
            return []
        scores, idx = self._index.search(self._embed(list(queries)), min(topk, len(self.docs)))
        return [[Hit(self.docs[i], float(s)) for s, i in zip(srow, irow, strict=True) if i >= 0]
                for srow, irow in zip(scores, idx, strict=True)]

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        return await asyncio.to_thread(self.search, queries, topk)

    async def close(self) -> None:
        return None
