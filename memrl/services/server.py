"""The retrieval service's HTTP app (FastAPI): `POST /retrieve`, `GET /health`.

`POST /retrieve {"queries": [...], "topk": k, "return_scores": true}` ->
`{"result": [[{"document": {"id", "title", "text"}, "score": s}, ...], ...]}` (reply_shape "memrl"), or
`{"result": [[{"document": {"title", "text"}}, ...], ...]}` (reply_shape "public": what the public MemAct
service, DCPO/tool_service/search_search_services.py, sends: no id, no score, whatever return_scores says).
Bad requests get 422 with `error` naming the field; a body over `max_body_bytes` gets 413 before it is read
(Content-Length checked first, a chunked body counted as it arrives); at most `max_concurrency` batches are
scored at once; an LRU cache keyed by (query, topk) answers repeated queries without scoring them again.
"""

# no `from __future__ import annotations`: FastAPI must see the request model class, defined in create_app
import asyncio
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from memrl.services.base import Hit
from memrl.services.retrieval import BM25Retriever, DenseRetriever

MAX_QUERIES = 256  # per request: bounds one request's work and response size
MAX_QUERY_CHARS = 4096
MAX_BODY_BYTES = 8 * 1024 * 1024  # 256 queries x 4096 characters fit with room for JSON escapes
REPLY_SHAPES = ("memrl", "public")


class BodyLimit:
    """ASGI middleware: 413 for a request body over `limit` bytes, decided before the app reads it.

    A Content-Length over the limit is refused at once (nothing read); a body without one (chunked) is
    counted as it arrives and refused when it passes the limit, so at most `limit` bytes are ever held."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def _refuse(self, send, detail: str) -> None:
        data = json.dumps({"error": detail}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(send, f"request body of {length.decode(errors='replace')} bytes is over "
                                            f"the limit of {self.limit} bytes")
        seen, over = 0, False

        async def limited_receive():
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:  # stop here: the app sees a disconnect, never the rest of the body
                    over = True
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg):
            if not over:  # the app's answer to a cut-off body is replaced by the 413 below
                await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over:
            await self._refuse(send, f"request body is over the limit of {self.limit} bytes")


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


def _hit_json(h: Hit, scores: bool, shape: str = "memrl") -> dict[str, Any]:
    d = h.document
    if shape == "public":  # the public service pops id and drops the score it computed
        return {"document": {"title": d.title, "text": d.text}}
    doc = {"id": d.id, "title": d.title, "text": d.text}
    return {"document": doc, "score": h.score} if scores else {"document": doc}


def create_app(retriever: BM25Retriever | DenseRetriever, max_concurrency: int = 8, cache_size: int = 10000,
               corpus: str = "", reply_shape: str = "memrl", max_body_bytes: int = MAX_BODY_BYTES):
    """The FastAPI app serving `retriever`; `reply_shape` "memrl" or "public" (module docstring)."""
    if reply_shape not in REPLY_SHAPES:
        raise ValueError(f"reply_shape must be one of {', '.join(REPLY_SHAPES)}, got {reply_shape!r}")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    from fastapi import FastAPI, Request  # noqa: PLC0415
    from fastapi.exceptions import RequestValidationError  # noqa: PLC0415
    from fastapi.responses import JSONResponse  # noqa: PLC0415
    from pydantic import BaseModel, ConfigDict, Field  # noqa: PLC0415

    max_topk = retriever.max_topk

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        queries: list[str] = Field(min_length=1, max_length=MAX_QUERIES)
        topk: int = Field(default=5, ge=1, le=max_topk)
        return_scores: bool = True

    app = FastAPI(title="memrl retrieval", version="1")
    app.add_middleware(BodyLimit, limit=max_body_bytes)
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
                "reply_shape": reply_shape, "max_body_bytes": max_body_bytes,
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
                # in a thread: the service scores up to max_concurrency batches at once, off its event loop
                fresh = await asyncio.to_thread(retriever.search, [req.queries[i] for i in missing], req.topk)
            for i, hits in zip(missing, fresh, strict=True):
                results[i] = hits
                cache.put((req.queries[i], req.topk), hits)
        # a JSONResponse goes out as it is: FastAPI's encoder would walk every hit once more
        return JSONResponse({"result": [[_hit_json(h, req.return_scores, reply_shape) for h in hits or []]
                                       for hits in results]})

    return app
