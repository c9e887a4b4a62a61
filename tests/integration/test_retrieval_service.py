"""`memrl serve retrieval` as a real subprocess on 127.0.0.1 (free port), driven by HTTPRetriever and httpx.

500 concurrent requests: no errors and exactly the in-process retriever's results; malformed requests get
422 naming the field; /health counts; an unreachable URL is a RetrievalError after the retries.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from doubles import free_port, retrieval_server

from memrl.data.corpus import build_corpus, write_corpus
from memrl.data.io import load_tasks
from memrl.services.base import RetrievalError
from memrl.services.client import HTTPRetriever
from memrl.services.retrieval import BM25Retriever

HOTPOT = Path("/work/shared/data/hotpotqa_dev_distractor_1143.json.xz")
pytestmark = pytest.mark.skipif(not HOTPOT.exists(), reason="shared data not present")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """(url, in-process retriever, 500 queries): the server indexes the corpus of 60 real questions."""
    tasks = load_tasks(HOTPOT, limit=60)
    docs = build_corpus(tasks)
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus(corpus, docs)
    with retrieval_server(corpus, "--max-concurrency", "4") as (url, _):
        # questions, then paragraph titles and first sentences: 500 distinct real queries
        queries = [t.question for t in tasks] + [d.title for d in docs] + [d.text.split(". ")[0] for d in docs]
        queries = list(dict.fromkeys(queries))[:500]
        assert len(queries) == 500
        yield url, BM25Retriever(docs), queries


def test_health(service):
    url, local, _ = service
    h = httpx.get(f"{url}/health").json()
    assert h["status"] == "ok" and h["documents"] == len(local.docs) == 591 and h["max_topk"] == 100


def test_500_concurrent_requests_equal_in_process(service):
    url, local, queries = service

    async def go():
        client = HTTPRetriever(url, timeout=30, retries=0, max_connections=64)
        try:
            return await asyncio.gather(*(client.retrieve([q], 5) for q in queries)), client.attempts
        finally:
            await client.close()

    before = httpx.get(f"{url}/health").json()
    results, attempts = asyncio.run(go())
    assert attempts == 500  # no retries were needed: 0 errors
    expect = local.search(queries, 5)
    assert [r[0] for r in results] == expect
    assert sum(bool(e) for e in expect) >= 495
    # the hand-checked one: the paragraph named by the query is the best hit
    i = queries.index("Scott Derrickson")
    assert expect[i][0].document.title == "Scott Derrickson"
    after = httpx.get(f"{url}/health").json()
    assert after["requests"] - before["requests"] == 500
    assert after["queries"] - before["queries"] == 500
    # asked again as one batch: all from the LRU cache, same answers
    again = httpx.post(f"{url}/retrieve", json={"queries": queries[:50], "topk": 5}).json()["result"]
    assert [[h["document"]["id"] for h in r] for r in again] == [[h.document.id for h in r] for r in expect[:50]]
    assert httpx.get(f"{url}/health").json()["cache_hits"] - after["cache_hits"] == 50


def test_return_scores_false_drops_scores(service):
    url, local, _ = service
    r = httpx.post(f"{url}/retrieve", json={"queries": ["Ed Wood"], "topk": 2, "return_scores": False}).json()
    assert [list(h) for h in r["result"][0]] == [["document"], ["document"]]
    best = local.search(["Ed Wood"], 1)[0][0].document
    assert best.title == "Ed Wood (film)"
    assert r["result"][0][0]["document"] == {"id": best.id, "title": best.title, "text": best.text}


@pytest.mark.parametrize(("body", "field"), [
    ({"topk": 3}, "queries"),
    ({"queries": [], "topk": 3}, "queries"),
    ({"queries": "Paris", "topk": 3}, "queries"),
    ({"queries": ["ok", 5], "topk": 3}, "queries.1"),
    ({"queries": ["Paris"], "topk": 0}, "topk"),
    ({"queries": ["Paris"], "topk": 101}, "topk"),
    ({"queries": ["Paris"], "topk": "5"}, "topk"),
    ({"queries": ["Paris"], "topk": 3, "return_scores": "yes"}, "return_scores"),
    ({"queries": ["Paris"], "topk": 3, "top_k": 3}, "top_k"),
    ({"queries": ["x" * 5000], "topk": 3}, "queries.0"),
])
def test_malformed_requests_get_422_naming_the_field(service, body, field):
    url, _, _ = service
    r = httpx.post(f"{url}/retrieve", json=body)
    assert r.status_code == 422
    assert f"field '{field}'" in r.json()["error"]


def test_invalid_json_body_is_422(service):
    url, _, _ = service
    r = httpx.post(f"{url}/retrieve", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"].startswith("field 'body': not valid JSON")


def test_client_reports_a_4xx_with_the_url(service):
    url, _, _ = service

    async def go():
        c = HTTPRetriever(url, retries=3)
        try:
            await c.retrieve(["x"], 0)
        finally:
            await c.close()
        return c

    with pytest.raises(RetrievalError, match=rf"{url}/retrieve: HTTP 422: .*field 'topk'"):
        asyncio.run(go())


def test_unreachable_url_is_a_retrieval_error_after_the_retries():
    url = f"http://127.0.0.1:{free_port()}"
    client = HTTPRetriever(url, timeout=2, retries=2, backoff=0.01)

    async def go():
        try:
            await client.retrieve(["Paris"], 5)
        finally:
            await client.close()

    with pytest.raises(RetrievalError, match=rf"retrieval service {url}/retrieve failed after 3 attempts: ConnectError"):
        asyncio.run(go())
    assert client.attempts == 3
