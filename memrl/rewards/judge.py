"""An LLM judge over an OpenAI-compatible chat-completions server (vLLM / SGLang serving any judge model).

Rubric (ours, after MemAct's published criteria): the prediction is CORRECT when it means the same as a
gold answer (wording, order, abbreviations and formatting may differ; numbers within 1% or equal after
unit conversion), PARTIAL when only partly right, INCORRECT otherwise; only CORRECT scores (partial = 0).
The judge answers one verdict word. A dead, slow, failing (5xx) or garbled judge never raises: the result scores 0
with `error` set, and `JudgeClient.counters` counts it under `judge_error` and `judge_error_<kind>`.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass

import httpx

RUBRIC = """You are grading an answer to a question against the gold answer(s).

Question: {question}
Gold answer(s): {gold}
Predicted answer: {prediction}

Rules:
- CORRECT if the predicted answer means the same as any gold answer: wording, word order, capitalization,
  abbreviations, articles and formatting may differ.
- Numbers: CORRECT if equal after unit conversion or within 1% of the gold value; dates must name the same
  day, month or year the gold answer names.
- INCORRECT if it is wrong, names a different entity, adds a conflicting claim, hedges between candidates,
  is empty.
- PARTIAL if it is only partly right (some but not all of what the gold answer asks for).

Reply with exactly one word: CORRECT, PARTIAL or INCORRECT."""

VERDICTS = ("correct", "partial", "incorrect")  # only "correct" scores: partial = 0
ERROR_KINDS = ("timeout", "unreachable", "http_status", "bad_response", "garbled")
_WORD = re.compile(r"\b(INCORRECT|PARTIALLY[ _-]?CORRECT|PARTIAL|CORRECT)\b", re.IGNORECASE)


@dataclass(frozen=True)
class JudgeConfig:
    """Where the judge is and how hard to try: `retries` extra attempts after timeouts, 5xx, lost connections."""

    base_url: str
    model: str
    timeout_s: float = 30.0
    retries: int = 2
    backoff_s: float = 0.5
    max_concurrency: int = 16
    max_tokens: int = 8
    temperature: float = 0.0
    api_key: str | None = None
    rubric: str = RUBRIC

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.retries < 0 or self.max_concurrency < 1 or self.backoff_s < 0:
            raise ValueError("JudgeConfig: needs timeout_s > 0, retries >= 0, backoff_s >= 0, max_concurrency >= 1")


@dataclass(frozen=True)
class JudgeResult:
    """score is 1.0 for CORRECT, else 0.0; verdict is one of VERDICTS or 'error'; error the error kind."""

    score: float
    verdict: str
    error: str | None = None
    raw: str = ""


def parse_verdict(text: str) -> str | None:
    """One of VERDICTS from the judge's reply: the single verdict it names; None if none or several."""
    text = text.rsplit("</think>", 1)[-1]  # a reasoning judge's thoughts may weigh several verdicts
    found = {"partial" if m.group(1).lower().startswith("partial") else m.group(1).lower()
             for m in _WORD.finditer(text)}
    return found.pop() if len(found) == 1 else None


class JudgeClient:
    """Async judge client: at most `max_concurrency` calls in flight, retries with exponential backoff."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        base = config.base_url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else (
            base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions"))
        self.counters: Counter[str] = Counter()
        self._sem = asyncio.Semaphore(config.max_concurrency)
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            n = self.config.max_concurrency
            self._client = httpx.AsyncClient(timeout=self.config.timeout_s, headers=headers,
                                             limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
        return self._client

    async def judge(self, question: str, gold: list[str], prediction: str) -> JudgeResult:
        """Judge one prediction; never raises on judge failures (they score 0 and are counted)."""
        self.counters["judge_calls"] += 1
        prompt = self.config.rubric.format(question=question, gold=" | ".join(gold), prediction=prediction)
        body = {"model": self.config.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": self.config.max_tokens, "temperature": self.config.temperature}
        async with self._sem:
            kind, text = await self._post(body)
        if kind is None:
            verdict = parse_verdict(text)
            if verdict is not None:
                self.counters[f"judge_{verdict}"] += 1
                return JudgeResult(1.0 if verdict == "correct" else 0.0, verdict, None, text)
            kind = "garbled"
        self.counters["judge_error"] += 1
        self.counters[f"judge_error_{kind}"] += 1
        return JudgeResult(0.0, "error", kind, text)

    async def _post(self, body: dict) -> tuple[str | None, str]:
        """(error kind or None, reply text or the last failure's description)."""
        kind, detail = "unreachable", ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                self.counters["judge_retries"] += 1
                await asyncio.sleep(self.config.backoff_s * 2 ** (attempt - 1))
            try:
                resp = await self._http().post(self.url, json=body)
            except httpx.TimeoutException:
                kind, detail = "timeout", f"{self.url}: timed out after {self.config.timeout_s}s"
                continue
            except httpx.HTTPError as e:
                kind, detail = "unreachable", f"{self.url}: {type(e).__name__}: {e}"
                continue
            if resp.status_code >= 500:
                kind, detail = "http_status", f"{self.url}: HTTP {resp.status_code}"
                continue
            if resp.status_code != 200:  # a 4xx will not get better by asking again
                return "http_status", f"{self.url}: HTTP {resp.status_code}: {resp.text[:200]}"
            try:
                text = resp.json()["choices"][0]["message"]["content"]
                if not isinstance(text, str):
                    raise TypeError("content is not a string")
            except (ValueError, KeyError, IndexError, TypeError) as e:
                return "bad_response", f"{self.url}: malformed chat completion ({e}): {resp.text[:200]}"
            return None, text
        return kind, detail

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
