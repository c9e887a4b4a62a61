"""DenseRetriever (optional `dense` extra) on the tiny local model: FAISS ranking equals the cosine ranking of
the model's own embeddings; a missing extra is a clear error."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from memrl.services.base import Document, RetrievalError

pytestmark = pytest.mark.slow  # sentence-transformers' import alone is a few CPU-seconds

DOCS = [Document(f"d{i}", t, x) for i, (t, x) in enumerate([
    ("Paris", "Paris is the capital of France."), ("Berlin", "Berlin is in Germany."),
    ("Rome", "Rome is an old city."), ("Cats", "Cats sleep a lot."), ("Tea", "Tea is a drink."),
])]


def test_dense_ranking_is_cosine_of_the_embeddings():
    pytest.importorskip("faiss")
    st = pytest.importorskip("sentence_transformers")
    from memrl.models.tiny import cached_tiny_model
    from memrl.services.retrieval import DenseRetriever

    path = str(cached_tiny_model("tiny"))
    r = DenseRetriever(DOCS, path, max_topk=20)
    queries = ["capital of France", "sleeping cats"]
    got = r.search(queries, 3)
    model = st.SentenceTransformer(path, device="cpu")
    e_docs = model.encode([f"{d.title}\n{d.text}" for d in DOCS], normalize_embeddings=True)
    e_q = model.encode(queries, normalize_embeddings=True)
    for hits, q in zip(got, e_q, strict=True):
        cos = e_docs @ q
        assert [h.document.id for h in hits] == [f"d{i}" for i in np.argsort(-cos, kind="stable")[:3]]
        assert [h.score for h in hits] == pytest.approx(sorted(cos, reverse=True)[:3], abs=1e-5)
    assert len(r.search(["x"], 20)[0]) == 5  # topk past the corpus size: every document once
    with pytest.raises(RetrievalError, match=r"topk must be an integer in 1\.\.20"):
        r.search(["x"], 21)


def test_missing_extra_is_a_clear_error(monkeypatch):
    from memrl.services.retrieval import DenseRetriever

    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    with pytest.raises(RetrievalError, match=r"missing: faiss\); install them with pip install 'memrl\[dense\]'"):
        DenseRetriever(DOCS, "unused")
