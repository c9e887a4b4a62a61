"""Retrieval interop with the public MemAct service, and the service's request body limit.

The public service (DCPO/tool_service/search_search_services.py: retrieve_endpoint) takes
`{"queries": [...], "topk": k, "return_scores": true}` and answers `{"result": [[{"document": row}, ...]]}`
where `row` is the corpus row with `id` and `wikipedia_id` popped and no score (it computes scores, then
appends only the document). A fake service replying exactly so (a real HTTP server on 127.0.0.1, free port)
serves the MemAct agent; `memrl serve retrieval --reply-shape public` must reply in the same shape, and
refuse bodies over `--max-body-bytes` with 413 before reading them.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

import httpx
import pytest
from doubles import JsonServer, ScriptedEngine, retrieval_server

from memrl.data.corpus import paragraph_id
from memrl.services.client import HTTPRetriever, _hit
from memrl.types import Task
from memrl.workflows.memact import MemActConfig, run

ROWS = [  # corpus rows as the public parquet holds them (id and wikipedia_id are popped from replies)
    {"id": "0", "wikipedia_id": "w0", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "1", "wikipedia_id": "w1", "title": "Lyon", "text": "Lyon is a city in France."},
    {"id": "2", "wikipedia_id": "w2", "title": "Berlin", "text": "Berlin is the capital of Germany."},
]


class PublicService:
    """Replies like the public retrieve_endpoint: rows ranked by shared words (a stand-in for its dense
    index), each as {"document": row minus id / wikipedia_id}; the request bodies are recorded."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.server = JsonServer(self.reply)
        self.url = self.server.url

    def reply(self, body: dict) -> dict:
        self.bodies.append(body)
        result = []
        for q in body["queries"]:
            words = set(q.lower().split())
            ranked = sorted(ROWS, key=lambda r: -len(words & set(f"{r['title']} {r['text']}".lower()
                                                                 .replace(".", "").split())))
            docs = [dict(r) for r in ranked[: body.get("topk") or 5]]
            for d in docs:
                d.pop("id", None)
                d.pop("wikipedia_id", None)
            result.append([{"document": d} for d in docs])
        return {"result": result}

    def stop(self) -> None:
        self.server.stop()


def test_memact_agent_searches_a_public_shape_service():
    svc = PublicService()
    try:
        search = '<tool_call>{"name": "search", "arguments": {"query": "capital of France", "topk": 2}}</tool_call>'
        cfg = MemActConfig(retriever_url=svc.url, no_prune_prob=0.0, temperature=0.0)
        traj = asyncio.run(run(Task("t1", "What is the capital of France?", "", ["Paris"]),
                               ScriptedEngine([search, "FINAL_ANSWER: Paris"]), cfg, random.Random(0)))
    finally:
        svc.stop()
    # the request is the public tool's: one query, topk as asked, return_scores true
    assert svc.bodies == [{"queries": ["capital of France"], "topk": 2, "return_scores": True}]
    assert traj.metrics["searches"] == 1.0 and traj.metrics["search_errors"] == 0.0
    tool = [m for m in traj.info["transcript"] if m["kind"] == "tool"]
    # "capital of france" shares 3 words with Paris's row, 2 with Berlin's ("capital", "of"), 1 with Lyon's
    assert [m["text"] for m in tool] == [
        '[r1] Search results for "capital of France":\n\n(1) Paris\nParis is the capital of France.'
        "\n\n(2) Berlin\nBerlin is the capital of Germany."]
    assert traj.final_answer == "Paris"


def test_reply_entries_without_id_or_score():
    h = _hit({"document": {"title": "Paris", "text": "Paris is the capital of France."}})
    # the id memrl's corpus builder gives the same passage: sha1("Paris\0Paris is ...")[:16]
    assert h.document.id == paragraph_id("Paris", "Paris is the capital of France.") and len(h.document.id) == 16
    assert h.score == 0.0
    h = _hit({"document": {"contents": '"Ed Wood"\nEdward Davis Wood Jr. was a filmmaker.'}, "score": 1.5})
    assert (h.document.title, h.document.text, h.score) == ("Ed Wood", "Edward Davis Wood Jr. was a filmmaker.", 1.5)
    h = _hit({"document": {"id": 7, "title": "T", "text": "x"}, "score": 2})
    assert (h.document.id, h.score) == ("7", 2.0)


@pytest.fixture(scope="module")
def public_server(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("c") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({k: r[k] for k in ("id", "title", "text")}) + "\n" for r in ROWS))
    with retrieval_server(corpus, "--reply-shape", "public", "--max-body-bytes", "4096") as (url, port):
        yield url, port


def test_serve_reply_shape_public(public_server):
    url, _ = public_server
    r = httpx.post(f"{url}/retrieve", json={"queries": ["capital of Germany"], "topk": 1, "return_scores": True})
    # BM25 over title + text: "capital" and "germany" both hit only Berlin's row (stopword "of" dropped)
    assert r.json() == {"result": [[{"document": {"title": "Berlin", "text": "Berlin is the capital of Germany."}}]]}
    h = httpx.get(f"{url}/health").json()
    assert (h["reply_shape"], h["max_body_bytes"]) == ("public", 4096)

    async def go():
        c = HTTPRetriever(url)
        try:
            return await c.retrieve(["capital of Germany"], 1)
        finally:
            await c.close()

    [[hit]] = asyncio.run(go())
    assert hit.document.id == paragraph_id("Berlin", "Berlin is the capital of Germany.")


def raw_request(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Send `head` (+ `body`) on a fresh connection; everything the server answers before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_body_over_the_limit_is_refused_before_it_is_read(public_server):
    url, port = public_server
    # 200 MB announced, not one body byte sent: the 413 comes back at once (nothing was waited for / read)
    t0 = time.monotonic()
    reply = raw_request(port, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 209715200\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 413") and time.monotonic() - t0 < 5
    assert b"request body of 209715200 bytes is over the limit of 4096 bytes" in reply
    # chunked (no Content-Length): counted as it arrives, refused once past 4096 bytes
    payload = json.dumps({"queries": ["x" * 3000, "y" * 3000], "topk": 1}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(payload[i:i + 1000]), payload[i:i + 1000])
                       for i in range(0, len(payload), 1000)) + b"0\r\n\r\n"
    reply = raw_request(port, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n", chunked)
    assert reply.startswith(b"HTTP/1.1 413") and b"request body is over the limit of 4096 bytes" in reply
    # under the limit: served as usual
    r = httpx.post(f"{url}/retrieve", json={"queries": ["Lyon"], "topk": 1})
    assert r.status_code == 200 and r.json()["result"][0][0]["document"]["title"] == "Lyon"
