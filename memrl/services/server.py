"""The retrieval service's HTTP app (FastAPI): `POST /retrieve`, `GET /health`.

`POST /retrieve {"queries": [...], "topk": k, "return_scores": true}` ->
`{"result": [[{"document": {"id", "title", "text"}, "score": s}, ...], ...]}` (MemAct's search API).
Bad requests get 422 with `error` naming the field; at most `max_concurrency` batches are scored at once;
an LRU cache keyed by (query, topk) answers repeated queries without scoring them again.
"""

# no `from __future__ import annotations`: FastAPI must see the request model class, defined in create_app
import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from memrl.services.base import Hit
from memrl.services.retrieval import BM25Retriever, DenseRetriever

MAX_QUERIES = 256  # per request: bounds one request's work and response size
MAX_QUERY_CHARS = 4096


@dataclass
class ServiceStats:
    """Counters reported by /health."""

    requests: int = 0
    queries: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    invalid: int = 0


class LRUCache:
    """A bounded map (query, topk) -> hits; the least recently used entry goes first (single event loop)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._d: OrderedDict[tuple[str, int], list[Hit]] = OrderedDict()

    def get(self, key: tuple[str, int]) -> list[Hit] | None:
        hits = self._d.get(key)
        if hits is not None:
            self._d.move_to_end(key)
        return hits

    def put(self, key: tuple[str, int], hits: list[Hit]) -> None:
        if self.capacity <= 0:
            return
        self._d[key] = hits
        self._d.move_to_end(key)
        while len(self._d) > self.capacity:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


def _hit_json(h: Hit, scores: bool) -> dict[str, Any]:
    d = h.document
    doc = {"id": d.id, "title": d.title, "text": d.text}
    return {"document": doc, "score": h.score} if scores else {"document": doc}


def create_app(retriever: BM25Retriever | DenseRetriever, max_concurrency: int = 8, cache_size: int = 10000, corpus: str = ""):
    """The FastAPI app serving `retriever`."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field

    max_topk = retriever.max_topk

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        queries: list[str] = Field(min_length=1, max_length=MAX_QUERIES)
        topk: int = Field(default=5, ge=1, le=max_topk)
        return_scores: bool = True

    app = FastAPI(title="memrl retrieval", version="1")
    stats = ServiceStats()
    cache = LRUCache(cache_size)
    sem = asyncio.Semaphore(max_concurrency)
    started = time.time()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        stats.invalid += 1
        parts = []
        for err in exc.errors():
            if err.get("type") == "json_invalid":  # loc is (body, character offset), not a field
                parts.append(f"field 'body': not valid JSON ({err.get('ctx', {}).get('error', 'decode error')})")
                continue
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
            parts.append(f"field '{loc}': {err.get('msg', 'invalid')}")
        return JSONResponse(status_code=422, content={"error": "; ".join(parts),
                                                      "detail": [{"loc": list(e.get("loc", ())),
                                                                  "msg": e.get("msg")} for e in exc.errors()]})

    @app.get("/health")
    async def health():
        return {"status": "ok", "corpus": corpus, "documents": len(retriever.docs), "max_topk": max_topk,
                "cache_entries": len(cache), "uptime_s": round(time.time() - started, 1), **stats.__dict__}

    @app.post("/retrieve")
    async def retrieve(req: RetrieveRequest):
        for i, q in enumerate(req.queries):
            if len(q) > MAX_QUERY_CHARS:
                stats.invalid += 1
                return JSONResponse(status_code=422, content={
                    "error": f"field 'queries.{i}': longer than {MAX_QUERY_CHARS} characters ({len(q)})"})
        stats.requests += 1
        stats.queries += len(req.queries)
        results: list[list[Hit] | None] = [cache.get((q, req.topk)) for q in req.queries]
        missing = [i for i, r in enumerate(results) if r is None]
        stats.cache_hits += len(results) - len(missing)
        stats.cache_misses += len(missing)
        if missing:
            async with sem:
                fresh = await retriever.retrieve([req.queries[i] for i in missing], req.topk)
            for i, hits in zip(missing, fresh, strict=True):
                results[i] = hits
                cache.put((req.queries[i], req.topk), hits)
        # a JSONResponse goes out as it is: FastAPI's encoder would walk every hit once more
        return JSONResponse({"result": [[_hit_json(h, req.return_scores) for h in hits or []] for hits in results]})

    return app
