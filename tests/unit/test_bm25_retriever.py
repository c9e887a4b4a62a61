"""BM25Retriever: scores equal the Lucene BM25 formula computed by hand, ranking and tie order, errors."""

from __future__ import annotations

import asyncio
import math

import pytest
from bm25s.stopwords import STOPWORDS_EN

from memrl.services.base import Document, RetrievalError
from memrl.services.retrieval import BM25Retriever, tokenize

DOCS = [
    Document("d0", "Paris", "Paris is the capital of France."),
    Document("d1", "Lyon", "Lyon is a city in France on the Rhone."),
    Document("d2", "Berlin", "Berlin is the capital of Germany. Berlin is large."),
    Document("d3", "Rome", "Rome is the capital of Italy."),
]


def lucene_bm25(query: str, docs: list[Document], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """score(q, d) = sum_t idf(t) * tf / (tf + k1 (1 - b + b |d| / avgdl)), idf = ln(1 + (N - df + .5)/(df + .5))."""
    stop = frozenset(STOPWORDS_EN)
    toks = [tokenize(f"{d.title} {d.text}", stop) for d in docs]
    avgdl = sum(map(len, toks)) / len(toks)
    out = []
    for t in toks:
        s = 0.0
        for w in set(tokenize(query, stop)):
            df = sum(w in u for u in toks)
            if not df:
                continue
            idf = math.log(1 + (len(toks) - df + 0.5) / (df + 0.5))
            tf = t.count(w)
            s += idf * tf / (tf + k1 * (1 - b + b * len(t) / avgdl))
        out.append(s)
    return out


def test_scores_match_the_formula_and_rank_best_first():
    r = BM25Retriever(DOCS)
    [hits] = asyncio.run(r.retrieve(["capital of Germany, Berlin"], 3))
    expect = lucene_bm25("capital of Germany, Berlin", DOCS)
    assert [h.document.id for h in hits] == ["d2", "d0", "d3"]
    for h in hits:
        assert h.score == pytest.approx(expect[int(h.document.id[1])], rel=1e-5)


def test_ties_in_corpus_order_and_no_match_is_empty():
    r = BM25Retriever(DOCS)
    # "capital" scores d0 and d3 equally (same length, one occurrence); d2 is longer, lower
    hits, none, stop_only = r.search(["capital", "zzz unknown", "the of is"], 20)
    assert [h.document.id for h in hits] == ["d0", "d3", "d2"]
    assert hits[0].score == hits[1].score > hits[2].score
    assert none == [] and stop_only == []
    assert [h.document.id for h in r.search(["capital"], 1)[0]] == ["d0"]


@pytest.mark.parametrize("topk", [0, -1, 101, 2.5, "5", True])
def test_bad_topk_is_a_retrieval_error(topk):
    with pytest.raises(RetrievalError, match=r"topk must be an integer in 1\.\.100"):
        BM25Retriever(DOCS).search(["paris"], topk)


def test_queries_must_be_strings_and_corpus_non_empty():
    with pytest.raises(RetrievalError, match="queries must be a list of strings"):
        BM25Retriever(DOCS).search("paris", 3)
    with pytest.raises(RetrievalError, match="corpus is empty"):
        BM25Retriever([])


def test_serve_with_a_missing_corpus_is_a_clear_cli_error(tmp_path, capsys):
    from memrl.cli import main

    assert main(["serve", "retrieval", "--corpus", str(tmp_path / "nope.jsonl")]) == 1
    assert f"memrl serve: error: corpus file {tmp_path / 'nope.jsonl'} does not exist" in capsys.readouterr().err


def test_a_corpus_of_stopwords_only_finds_nothing():
    # every word of both documents is an English stopword: no term to index (bm25s raised on an empty
    # vocabulary); every query then finds nothing, stopword or not
    r = BM25Retriever([Document("a", "", "the of and"), Document("b", "", "is a")])
    assert r.search(["the", "paris"], 3) == [[], []]
