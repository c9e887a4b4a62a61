"""`HTTPRetriever`: the `Retriever` contract over `memrl serve retrieval` (POST {url}/retrieve).

One pooled httpx.AsyncClient; connection errors, timeouts and 5xx answers are retried with exponential
backoff (`backoff * 2**attempt` seconds); a 4xx is not retried. Every failure raises RetrievalError naming
the URL, which MemAct's search tool turns into a tool message.

Replies: `{"result": [[{"document": {...}, "score": s}, ...], ...]}`, one list per query. memrl's service
sends documents {id, title, text} with a score; the public MemAct service sends the corpus row without its
id and no score. So `id` is optional (absent: `paragraph_id(title, text)`, the first 16 hex digits of
sha1(title NUL text), the id `memrl data corpus` gives the same passage), `score` too (absent: 0.0, the
service's order kept), and a Search-R1 style row with `contents` ('"Title"\nbody') instead of `text`
gives title = its first line without quotes, text = the rest.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from memrl.data.corpus import paragraph_id
from memrl.services.base import Document, Hit, RetrievalError


class HTTPRetriever:
    """Client of the retrieval service; satisfies `Retriever`."""

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.5,
                 max_connections: int = 32):
        if retries < 0 or timeout <= 0 or backoff < 0 or max_connections < 1:
            raise ValueError("HTTPRetriever: needs timeout > 0, retries >= 0, backoff >= 0, max_connections >= 1")
        base = url.rstrip("/")
        self.url = base if base.endswith("/retrieve") else base + "/retrieve"
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.attempts = 0  # HTTP attempts made, retries included (tests and metrics read it)
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # made on first use, inside the event loop that uses it
            self._client = httpx.AsyncClient(timeout=self.timeout, limits=self._limits)
        return self._client

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        body = {"queries": list(queries), "topk": topk, "return_scores": True}
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            self.attempts += 1
            try:
                resp = await self._http().post(self.url, json=body)
            except httpx.TimeoutException:
                last = f"timed out after {self.timeout}s"
                continue
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise RetrievalError(f"retrieval service {self.url}: HTTP {resp.status_code}: {resp.text[:300]}")
            return self._parse(resp, len(queries))
        raise RetrievalError(f"retrieval service {self.url} failed after {self.retries + 1} attempts: {last}")

    def _parse(self, resp: httpx.Response, n: int) -> list[list[Hit]]:
        try:
            data: Any = resp.json()
            result = data["result"]
            if not isinstance(result, list) or len(result) != n:
                raise ValueError(f"expected {n} result lists")
            return [[_hit(h) for h in hits] for hits in result]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RetrievalError(f"retrieval service {self.url}: malformed response ({e}): {resp.text[:200]}") from e

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _hit(h: dict[str, Any]) -> Hit:
    """One reply entry as a Hit (module docstring: the id and score rules)."""
    doc = h["document"]
    title = doc.get("title")
    if "text" in doc:
        text = doc["text"]
    else:  # a Search-R1 style row: contents = '"Title"\nbody'
        first, _, text = str(doc["contents"]).partition("\n")
        title = first.strip().strip('"') if title is None else title
    title, text = str(title or ""), str(text)
    doc_id = doc.get("id")
    score = h.get("score")
    return Hit(Document(str(doc_id) if doc_id is not None else paragraph_id(title, text), title, text),
               float(score) if score is not None else 0.0)
