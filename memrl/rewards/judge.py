"""An LLM judge over an OpenAI-compatible chat-completions server (vLLM / SGLang serving any judge model).

Rubric (ours by default, after MemAct's published criteria): the prediction is CORRECT when it means the
same as a gold answer (wording, order, abbreviations and formatting may differ; numbers within 1% or equal
after unit conversion), PARTIAL when only partly right, INCORRECT otherwise; only CORRECT scores (partial =
0). `rubric_file` replaces the text (the user supplies the published one); the verdict tags and how they
are read are settings too (`JudgeSettings`, spelled `workflow.judge.<field>` for MemAct).

Reasoning judges: the verdict is read from the final answer only. A server's separate `reasoning_content`
/ `reasoning` field is never read; in `content`, the text after the last harmony final-channel marker
(`<|channel|>final<|message|>`) is the answer, and a `<think>...</think>` block before it is dropped. A reply
with reasoning but no final part (the token budget ran out while thinking) has no verdict.

A dead, slow, failing or garbled judge never raises: the result scores 0 with `error` set to one of
ERROR_KINDS, and `JudgeClient.counters` counts it under `judge_error` and `judge_error_<kind>`; the console
says the first failure with its error, then the count at 10, 100, 1000, ... failures, while the run goes on.
Each call is bounded by `timeout_s` as a whole (not only each read). An empty prediction is not sent (it
scores 0, as the published reward does without a call).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from memrl.config import MAX_COUNT, MAX_SECONDS, MAX_TEMPERATURE, MAX_TOKENS, ConfigError, valid

log = logging.getLogger(__name__)

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
_RUBRIC_VERDICT_LINE = "Reply with exactly one word: CORRECT, PARTIAL or INCORRECT."


def default_rubric(tags: tuple[str, str, str] = ("CORRECT", "PARTIAL", "INCORRECT")) -> str:
    """memrl's rubric asking for the configured verdict tags (RUBRIC itself for memrl's tags), so a config
    with the published tags but no rubric_file still gets replies the tags can be read from."""
    if tuple(tags) == ("CORRECT", "PARTIAL", "INCORRECT"):
        return RUBRIC
    c, p, i = tags
    return RUBRIC.replace(_RUBRIC_VERDICT_LINE, f"Reply with exactly one of: {c} (correct), {p} (partial) or {i} "
                                                "(incorrect).")

VERDICTS = ("correct", "partial", "incorrect")  # only "correct" scores: partial = 0
ERROR_KINDS = ("http_error", "timeout", "no_verdict", "garbled")
"""http_error: unreachable or a non-200 status; timeout; no_verdict: a reply with no verdict tag in its
final part (also an empty one, or reasoning only); garbled: a malformed body, or several verdicts named."""
VERDICT_RULES = ("single", "contains_correct")
ON_FAILURE = ("zero", "exclude")
HARMONY_FINAL = "final<|message|>"  # what follows `<|channel|>` on gpt-oss's final channel
_HARMONY_STOPS = ("<|end|>", "<|return|>", "<|start|>", "<|call|>")
# rubric placeholders: the published rubric's names are accepted as aliases of ours
PLACEHOLDERS = {"question": "question", "gold": "gold", "ground_truth": "gold",
                "prediction": "prediction", "model_answer": "prediction"}
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


@dataclass
class JudgeSettings:
    """The judge as configured (MemAct: `workflow.judge.<field>`), and what `JudgeClient` takes: the one
    judge config (the rubric file is read and the key taken from api_key_env when the client is built).
    Defaults are memrl's. The published
    MemAct judge (verl/utils/reward_score/mem_agent.py: compute_score) is max_tokens=800, temperature=1.0,
    top_p not sent, the published rubric (rubric_file), tags <ANSWER_CORRECT> / <ANSWER_PARTIAL_CORRECT> /
    <ANSWER_INCORRECT>, verdict_rule=contains_correct, on_failure=zero, retries=2, timeout_s=600."""

    url: str | None = None
    """OpenAI-compatible server of the judge (e.g. http://127.0.0.1:8001/v1); None = no judge (rule reward)."""
    required: bool = False
    """True: the reward must be the judge's, so a config without `url` is refused up front, naming
    workflow.judge.url (the memact_official preset: the published reward is the judge's verdict).
    False: no url = memrl's rule reward."""
    model: str = ""
    """The judge's served model name."""
    api_key_env: str = ""
    """Name of the environment variable holding the judge's API key, sent as a Bearer token; "" = none.
    The key itself is never a config value, so it is never written to a run directory."""
    timeout_s: float = valid(30.0, gt=0, le=MAX_SECONDS)
    """Per-request timeout in seconds."""
    retries: int = valid(2, ge=0, le=MAX_COUNT)
    """Extra attempts after a timeout, a lost connection, HTTP 408 / 429 or 5xx."""
    backoff_s: float = valid(0.5, ge=0, le=MAX_SECONDS)
    """First retry delay; doubled per retry."""
    max_concurrency: int = valid(16, ge=1, le=MAX_COUNT)
    """Judge calls in flight at once."""
    max_tokens: int = valid(8, ge=1, le=MAX_TOKENS)
    """Generation budget of one verdict (a reasoning judge needs hundreds: the published 800)."""
    temperature: float = valid(0.0, ge=0, le=MAX_TEMPERATURE)
    """Sampling temperature of the judge."""
    top_p: float | None = valid(None, gt=0, le=1, note="null = not sent")
    """Sent when set; None = not sent (the server's default), as the published reward does."""
    rubric_file: str | None = None
    """Text file replacing memrl's rubric; placeholders {question}, {gold} (or {ground_truth}) and
    {prediction} (or {model_answer}); other braces are left as they are. None = memrl's rubric."""
    correct_tag: str = "CORRECT"
    """Verdict tag that scores 1 (matched case-insensitively, as a whole token)."""
    partial_tag: str = "PARTIAL"
    """Verdict tag of a partly right answer (scores 0)."""
    incorrect_tag: str = "INCORRECT"
    """Verdict tag of a wrong answer (scores 0)."""
    verdict_rule: str = valid("single", choices=VERDICT_RULES)
    """single: exactly one distinct verdict in the final part (none = no_verdict, several = garbled);
    contains_correct: CORRECT when the correct tag appears there at all (the published rule)."""
    on_failure: str = valid("zero", choices=ON_FAILURE)
    """A failed judgement (ERROR_KINDS) scores 0 ("zero", published) or scores 0 and marks the trajectory
    `info["exclude_from_group"]` so group statistics can leave it out ("exclude")."""

    def __post_init__(self) -> None:
        w = "workflow.judge"
        if self.required and not self.url:
            raise ValueError(f"{w}.url is required ({w}.required=true: the reward is the LLM judge's verdict); "
                             f"set {w}.url=http://HOST:PORT/v1 and {w}.model=NAME, or {w}.required=false for "
                             "memrl's rule reward")
        if self.timeout_s <= 0 or self.backoff_s < 0:
            raise ValueError(f"{w}.timeout_s must be > 0 and {w}.backoff_s >= 0, got {self.timeout_s}, "
                             f"{self.backoff_s}")
        if self.retries < 0 or self.max_concurrency < 1 or self.max_tokens < 1:
            raise ValueError(f"{w}: retries must be >= 0, max_concurrency and max_tokens >= 1, got "
                             f"{self.retries}, {self.max_concurrency}, {self.max_tokens}")
        if self.temperature < 0 or (self.top_p is not None and not 0 < self.top_p <= 1):
            raise ValueError(f"{w}: temperature must be >= 0 and top_p in (0, 1] or null, got "
                             f"{self.temperature}, {self.top_p}")
        if self.verdict_rule not in VERDICT_RULES:
            raise ValueError(f"{w}.verdict_rule must be one of {', '.join(VERDICT_RULES)}, got {self.verdict_rule!r}")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"{w}.on_failure must be one of {', '.join(ON_FAILURE)}, got {self.on_failure!r}")
        tags = [self.correct_tag, self.partial_tag, self.incorrect_tag]
        if not all(t.strip() for t in tags) or len({t.lower() for t in tags}) != 3:
            raise ValueError(f"{w}: correct_tag, partial_tag and incorrect_tag must be three different "
                             f"non-empty strings, got {tags}")
        if self.url and self.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ValueError(f"{w}.api_key_env must name an environment variable, got {self.api_key_env!r}")
        if self.rubric_file is not None:
            load_rubric(self.rubric_file)  # fails now, naming the file, not at the first judgement

    def api_key(self) -> str | None:
        """The key the variable `api_key_env` holds (None when api_key_env is ""); a one-line ConfigError
        naming the field when that variable is not set."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if self.api_key_env and not key:

            raise ConfigError(f"workflow.judge.api_key_env={self.api_key_env}: that environment variable is not set")
        return key

    @property
    def tags(self) -> tuple[str, str, str]:
        """(correct, partial, incorrect)."""
        return (self.correct_tag, self.partial_tag, self.incorrect_tag)

    def rubric_text(self) -> str:
        """The rubric sent: `rubric_file`'s text, else memrl's rubric asking for the configured tags."""
        return load_rubric(self.rubric_file) if self.rubric_file else default_rubric(self.tags)


def load_rubric(path: str) -> str:
    """A rubric file's text; ValueError naming the file when it is unreadable or lacks a placeholder."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"workflow.judge.rubric_file={path}: cannot be read ({e})") from e
    found = {PLACEHOLDERS[m] for m in _PLACEHOLDER.findall(text)}
    missing = [p for p in ("question", "gold", "prediction") if p not in found]
    if missing:
        raise ValueError(f"workflow.judge.rubric_file={path}: no placeholder for {', '.join(missing)} (use "
                         "{question}, {gold} or {ground_truth}, {prediction} or {model_answer})")
    return text


def render_rubric(rubric: str, question: str, gold: str, prediction: str) -> str:
    """The rubric with its placeholders filled (only those in PLACEHOLDERS; other braces stay)."""
    values = {"question": question, "gold": gold, "prediction": prediction}
    return _PLACEHOLDER.sub(lambda m: values[PLACEHOLDERS[m.group(1)]], rubric)


@dataclass(frozen=True)
class JudgeResult:
    """score is 1.0 for CORRECT, else 0.0; verdict is one of VERDICTS, 'error' or 'empty' (an empty
    prediction, not sent); error is one of ERROR_KINDS or None; raw the reply (or the failure)."""

    score: float
    verdict: str
    error: str | None = None
    raw: str = ""


def final_part(content: str) -> str:
    """The answer part of a reply: after the last harmony final-channel marker (cut at the next harmony
    control token), without a <think> block; "" when the reply has reasoning but no final part."""
    i = content.rfind(HARMONY_FINAL)
    if i >= 0:
        text = content[i + len(HARMONY_FINAL):]
        cuts = [text.find(s) for s in _HARMONY_STOPS if s in text]
        text = text[: min(cuts)] if cuts else text
    elif "<|channel|>" in content:  # analysis / commentary only: the budget ran out before the final part
        return ""
    else:
        text = content
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:  # an unclosed think block: no answer yet
        return ""
    return text.strip()


def _tag_pattern(tag: str) -> str:
    """`tag` as a whole token: word characters at its edges may not continue into a neighbour."""
    pat = re.escape(tag)
    if re.match(r"\w", tag):
        pat = r"(?<!\w)" + pat
    if re.search(r"\w$", tag):
        pat += r"(?!\w)"
    return pat


def _verdict_regex(tags: tuple[str, str, str]) -> tuple[re.Pattern[str], list[str]]:
    correct, partial, incorrect = tags
    alts: list[tuple[str, str]] = []
    if re.fullmatch(r"\w+", correct) and re.fullmatch(r"\w+", partial):
        # "PARTIALLY CORRECT", "PARTIAL_CORRECT": partial, not correct
        alts.append(("partial", rf"(?<!\w){re.escape(partial)}(?:LY)?[ _-]?{re.escape(correct)}(?!\w)"))
    alts += sorted([("correct", _tag_pattern(correct)), ("partial", _tag_pattern(partial)),
                    ("incorrect", _tag_pattern(incorrect))], key=lambda a: -len(a[1]))
    regex = re.compile("|".join(f"(?P<v{i}>{p})" for i, (_, p) in enumerate(alts)), re.IGNORECASE)
    return regex, [v for v, _ in alts]


def read_verdict(content: str, tags: tuple[str, str, str] = ("CORRECT", "PARTIAL", "INCORRECT"),
                 rule: str = "single") -> tuple[str | None, str | None]:
    """(verdict, None) or (None, "no_verdict" | "garbled") from a reply's content (its final part only)."""
    regex, names = _verdict_regex(tags)
    text = final_part(content)
    found = {names[int(m.lastgroup[1:])] for m in regex.finditer(text) if m.lastgroup}
    if not found:
        return None, "no_verdict"
    if rule == "contains_correct":
        return ("correct" if "correct" in found else "partial" if "partial" in found else "incorrect"), None
    if len(found) > 1:
        return None, "garbled"
    return found.pop(), None


def parse_verdict(text: str) -> str | None:
    """One of VERDICTS from a reply under memrl's default tags and rule; None if none or several."""
    return read_verdict(text)[0]


class JudgeClient:
    """Async judge client: at most `max_concurrency` calls in flight, retries with exponential backoff."""

    def __init__(self, config: JudgeSettings):
        """`config` is the judge section itself (its `url` set): the rubric file is read and the key taken
        from `api_key_env` now, so a missing one fails before the first judgement."""
        if not config.url:
            raise ValueError("JudgeClient needs workflow.judge.url (the judge server)")
        self.config = config
        self.api_key = config.api_key()
        self.rubric = config.rubric_text()
        base = config.url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else (
            base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions"))
        self.counters: Counter[str] = Counter()
        self.first_error = ""
        """The first failed judgement's error kind and description (said on the console)."""
        self._sem = asyncio.Semaphore(config.max_concurrency)
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            n = self.config.max_concurrency
            self._client = httpx.AsyncClient(timeout=self.config.timeout_s, headers=headers,
                                             limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
        return self._client

    def body(self, question: str, gold: list[str], prediction: str) -> dict:
        """The chat-completions request for one judgement."""
        c = self.config
        prompt = render_rubric(self.rubric, question, " | ".join(gold), prediction)
        body = {"model": c.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": c.max_tokens, "temperature": c.temperature}
        if c.top_p is not None:
            body["top_p"] = c.top_p
        return body

    async def judge(self, question: str, gold: list[str], prediction: str) -> JudgeResult:
        """Judge one prediction; never raises on judge failures (they score 0 and are counted)."""
        if not prediction.strip():
            self.counters["judge_empty"] += 1
            return JudgeResult(0.0, "empty")
        self.counters["judge_calls"] += 1
        async with self._sem:
            kind, text = await self._post(self.body(question, gold, prediction))
        if kind is None:
            verdict, kind = read_verdict(text, self.config.tags, self.config.verdict_rule)
            if verdict is not None:
                self.counters[f"judge_{verdict}"] += 1
                return JudgeResult(1.0 if verdict == "correct" else 0.0, verdict, None, text)
        self.counters["judge_error"] += 1
        self.counters[f"judge_error_{kind}"] += 1
        self._say_failure(kind, text)
        return JudgeResult(0.0, "error", kind, text)

    def _say_failure(self, kind: str | None, detail: str) -> None:
        """A failing judge is said on the console while the run goes on: the first failure with its error,
        then the count at 10, 100, 1000, ... failures (each scores 0; metrics count them as judge_error)."""
        n = self.counters["judge_error"]
        if n == 1:
            self.first_error = f"{kind}: {detail[:300]}"
            log.warning("judge %s failed (%s); the judgement scores 0 and the run goes on (judge_error counts "
                        "failures)", self.url, self.first_error)
        elif n >= 10 and str(n).strip("0") == "1":
            log.warning("judge %s: %d judgements failed so far, each scored 0 (first: %s)", self.url, n,
                        self.first_error)

    async def chat(self, prompt: str) -> tuple[str | None, str]:
        """One chat completion of `prompt` with the configured model, max_tokens and temperature (no rubric):
        (error kind or None, the reply's content or the failure). Used for a summary service (memrl.workflows.
        summarize, `workflow.summarizer`); never raises on a failed call."""
        c = self.config
        body: dict = {"model": c.model, "messages": [{"role": "user", "content": prompt}],
                      "max_tokens": c.max_tokens, "temperature": c.temperature}
        if c.top_p is not None:
            body["top_p"] = c.top_p
        async with self._sem:
            return await self._post(body)

    async def _post(self, body: dict) -> tuple[str | None, str]:
        """(error kind or None, the reply's content or the last failure's description)."""
        kind, detail = "http_error", ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                self.counters["judge_retries"] += 1
                await asyncio.sleep(self.config.backoff_s * 2 ** (attempt - 1))
            try:  # httpx's timeout bounds each read; wait_for bounds the whole call (a server trickling bytes)
                resp = await asyncio.wait_for(self._http().post(self.url, json=body), self.config.timeout_s)
            except (httpx.TimeoutException, TimeoutError):
                kind, detail = "timeout", f"{self.url}: timed out after {self.config.timeout_s}s"
                continue
            except httpx.HTTPError as e:
                kind, detail = "http_error", f"{self.url}: {type(e).__name__}: {e}"
                continue
            if resp.status_code >= 500 or resp.status_code in (408, 429):
                kind, detail = "http_error", f"{self.url}: HTTP {resp.status_code}"
                continue
            if resp.status_code != 200:  # any other 4xx will not get better by asking again
                return "http_error", f"{self.url}: HTTP {resp.status_code}: {resp.text[:200]}"
            try:
                message = resp.json()["choices"][0]["message"]
                content = message.get("content")
                if content is not None and not isinstance(content, str):
                    raise TypeError("content is not a string")
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                return "garbled", f"{self.url}: malformed chat completion ({e}): {resp.text[:200]}"
            # a separate reasoning field (reasoning_content / reasoning) is never read for the verdict
            return None, content or ""
        return kind, detail

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
