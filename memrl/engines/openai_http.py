"""OpenAI-compatible HTTP engine: prompt token ids to a running server's /v1/completions, token ids +
logprobs back. For `vllm serve` (python -m vllm.entrypoints.openai.api_server) and SGLang. With
`api="chat"` it speaks /v1/chat/completions instead (servers that have nothing else, such as MemAgent's
serve/llm070.py): evaluation only, see "Chat mode" below.

Request: {"prompt": [ids], "logprobs": 1, "return_token_ids": true, "return_tokens_as_token_ids": true,
"temperature", "top_p", "top_k", "seed", "stop_token_ids", "max_tokens"}. Token ids are read from
`choices[0].token_ids` (vLLM's return_token_ids), else from "token_id:N" strings in
`choices[0].logprobs.tokens` (vLLM's return_tokens_as_token_ids); logprobs from
`choices[0].logprobs.token_logprobs`. A reply with neither, or with lengths that disagree, is an
EngineError naming the URL: decoded text is never re-tokenized.
Every reply's values pass `check_reply_values` before anything decodes them (token ids integers in
the vocabulary, logprobs finite numbers <= 0): a reply that fails is logged, counted (`bad_replies`) and
retried like a 5xx, then an EngineError naming the URL, the field, the position and the value.

Logprob convention: the server decides. Start vLLM with `--logprobs-mode processed_logprobs` to get
memrl's convention (see memrl.engines.vllm); its default, raw_logprobs, ignores the temperature.

SGLang (untested here): its OpenAI server accepts top_k, stop_token_ids and token-id prompts; token
ids come back only where it supports `return_token_ids`/"token_id:N" logprob tokens (without them this
engine fails with a clear error rather than re-tokenizing text); its logprobs are of the
temperature-scaled distribution; weights reload from a directory via /update_weights_from_disk.

Chat mode (api="chat"): the request carries the prompt's chat messages (the workflows' prompt ids are
memrl.engines.base.ChatPrompt lists that hold them; the server renders its own chat template), plus
{"logprobs": true, "top_logprobs": 0, "return_token_ids": true, "return_tokens_as_token_ids": true} and
the sampling fields. Token ids come from `choices[0].token_ids`, else from "token_id:N" strings in
`choices[0].logprobs.content[*].token`, else (a server that returns text only, like vLLM 0.7's chat
endpoint) by tokenizing `choices[0].message.content` with the local tokenizer; logprobs come from
`logprobs.content[*].logprob` when the ids came from the server and the counts agree, else
`Completion.info["logprobs"]` is "unavailable" and the logprobs are 0.0 placeholders (a Segment holds
finite logprobs; nothing in evaluation reads them) (`info["token_ids"]` says "server" or "text"). Training
refuses chat mode up front (memrl.training.assemble.validate): the prompt tokens the server conditioned on
are not known to be the ones trained on, and token ids and logprobs are optional extras of the chat API.

LoRA adapters (vLLM servers started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True):
`load_adapter(dir)` POSTs /v1/load_lora_adapter with a new name per call (`memrl-lora-<tag>-<version>`, the
tag unique to this engine object) and the PEFT-format directory (on the server's filesystem); requests then
name that adapter as their `model`, and the previous adapter is unloaded (/v1/unload_lora_adapter).
`unload_adapter()` unloads the current one and goes back to the base model. A refusal is an EngineError
naming the endpoint. Used by `engine.openai.lora_sync=adapter` (docs/guides/lora.md).

Transport: one pooled httpx AsyncClient for the engine's lifetime, made on first use in the event loop
of the run (memrl.runtime.RolloutRuntime: one loop per run) and closed by `close()`; a call from another
loop while it is open is an EngineError (pooled connections cannot cross loops), never a silent second
client. A semaphore caps requests in flight, per-request timeouts, and retries with exponential backoff on
connection errors, timeouts and 5xx replies. httpx is used when installed, else httpx2 (same API; a
huggingface_hub dependency).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from transformers import AutoTokenizer

from memrl.config import MAX_COUNT, MAX_SECONDS, valid
from memrl.engines.base import Capabilities, Completion, EngineError, SamplingParams
from memrl.engines.config import EngineConfig, OpenAISection

log = logging.getLogger(__name__)

try:  # pragma: no cover - which one is installed depends on the environment
    import httpx
except ImportError:  # pragma: no cover
    import httpx2 as httpx  # type: ignore[no-redef]


API_KINDS = ("completions", "chat")
"""Which OpenAI endpoint the engine speaks (OpenAIConfig.api / engine.openai.api)."""
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


_ENGINE, _OPENAI = EngineConfig(), OpenAISection()


@dataclass
class OpenAIConfig:
    """Settings of the HTTP engine; the defaults are the `engine.openai` section's (memrl.engines.config.OpenAISection:
    served_model is `model` here, engine.max_batch_size is `max_concurrency`), the one place they are set."""

    base_url: str = _OPENAI.base_url
    """Server root, with or without a trailing /v1."""
    tokenizer: str = ""
    """Local tokenizer directory (the served model's); workflows tokenize with it."""
    model: str | None = _OPENAI.served_model
    """Served model name; None = the server's default (vLLM and SGLang pick their only model; api=chat asks
    GET /v1/models for it, as vLLM 0.7-era chat servers require one)."""
    api_key: str | None = _OPENAI.api_key
    """Sent as a Bearer token; None = the environment variable api_key_env names, when set."""
    api_key_env: str = _OPENAI.api_key_env
    """Environment variable holding the key when api_key is None; "" = none."""
    server: str = _OPENAI.server
    """vllm | sglang: which weight-reload endpoint update_weights uses."""
    api: str = valid(_OPENAI.api, choices=API_KINDS)
    """completions (/v1/completions, token ids in and out) | chat (/v1/chat/completions, messages in;
    evaluation only)."""
    vllm_reload_method: str = _OPENAI.vllm_reload_method
    """Worker method update_weights calls through vLLM's /collective_rpc. "memrl_load_weights" needs the
    server started with --worker-extension-cls memrl.engines.vllm.MemrlWorkerExtension; "reload_weights"
    works on a stock server, but vLLM 0.32 then leaves a tied lm_head stale (see memrl.engines.vllm)."""
    max_concurrency: int = valid(_ENGINE.max_batch_size, ge=1, le=MAX_COUNT)
    """Requests in flight at once, per engine."""
    timeout_s: float = valid(_OPENAI.timeout_s, gt=0, le=MAX_SECONDS)
    """Per-request timeout (read); connecting times out after connect_timeout_s."""
    connect_timeout_s: float = valid(_OPENAI.connect_timeout_s, gt=0, le=MAX_SECONDS)
    max_retries: int = valid(_OPENAI.max_retries, ge=0, le=MAX_COUNT)
    """Retries after a connection error, timeout or 5xx (so up to max_retries + 1 attempts)."""
    backoff_s: float = valid(_OPENAI.backoff_s, ge=0, le=MAX_SECONDS)
    """First retry delay; doubled per retry, with up to 10% jitter."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIConfig.base_url must start with http:// or https://, got {self.base_url!r}")
        if self.server not in ("vllm", "sglang"):
            raise ValueError(f"OpenAIConfig.server must be vllm or sglang, got {self.server!r}")
        if self.api not in API_KINDS:
            raise ValueError(f"OpenAIConfig.api must be one of {', '.join(API_KINDS)}, got {self.api!r}")
        if self.max_concurrency < 1 or self.max_retries < 0 or self.timeout_s <= 0:
            raise ValueError("OpenAIConfig: max_concurrency >= 1, max_retries >= 0 and timeout_s > 0 are required")


def _root(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _sampling_fields(sampling: SamplingParams, model: str | None) -> dict[str, Any]:
    """The body fields both endpoints share: sampling, ids in the reply (vLLM / SGLang extras; servers ignore
    fields they do not know), one unstreamed choice, and the model when named."""
    body: dict[str, Any] = {
        "max_tokens": int(sampling.max_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "n": 1,
        "stream": False,
    }
    if sampling.top_k > 0:
        body["top_k"] = int(sampling.top_k)
    if sampling.seed is not None:
        body["seed"] = int(sampling.seed)
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if model:
        body["model"] = model
    return body


def completion_request(prompt_ids: list[int], sampling: SamplingParams, model: str | None) -> dict[str, Any]:
    """The /v1/completions body for one token-id prompt."""
    return {
        "prompt": [int(t) for t in prompt_ids],
        **_sampling_fields(sampling, model),
        "logprobs": 1,  # the sampled token's logprob is token_logprobs; 1 is accepted by every server
        "skip_special_tokens": False,
    }


def chat_request(messages: list[dict[str, Any]], sampling: SamplingParams, model: str | None,
                 template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The /v1/chat/completions body for one prompt's messages; `template_kwargs` (the workflow's
    enable_thinking) go as chat_template_kwargs, which vLLM and SGLang pass to the chat template."""
    body = {
        "messages": messages,
        **_sampling_fields(sampling, model),
        "logprobs": True,
        "top_logprobs": 0,  # the sampled token's own logprob only
    }
    if template_kwargs:
        body["chat_template_kwargs"] = dict(template_kwargs)
    return body


MAX_TOKEN_ID = 2**31 - 1
"""Token ids at or above it are refused even without a vocabulary size (tokenizers index with 32 bits)."""
LOGPROB_SLACK = 1e-6
"""A log-probability above it is not one (memrl.types.Segment admits the same rounding)."""

MAX_REPLY_BYTES = 1 << 28
"""A server's reply body is read up to this many bytes (256 MiB); a larger one is refused, not held."""
MAX_CHARS_PER_TOKEN = 256
"""A chat reply's text may hold at most max_tokens x this many characters (no token is longer): a server that
ignores max_tokens is refused before its text reaches the tokenizer (a 20 MB reply exhausted its memory)."""


class BadReply(EngineError):
    """A reply whose values cannot be what the server generated (token ids outside the vocabulary, a
    positive or non-finite log-probability, a value of the wrong JSON type): retried like a transient
    failure, counted in `OpenAIEngine.bad_replies`."""


def check_reply_values(ids: Any, logprobs: Any, url: str, what: str, vocab_size: int | None = None,
                       ids_from_text: bool = False) -> tuple[list[int], list[float]]:
    """The one check of what a completion or chat reply says it generated, before anything decodes it:
    each token id a JSON integer (a "token_id:N" string's digits when `ids_from_text`) in [0, vocab_size)
    (or [0, MAX_TOKEN_ID) without one), each logprob a JSON number, finite and <= 0; a list each. Returns
    (token ids, logprobs) or raises BadReply naming `url`, `what` field, the position and the value."""
    def bad(msg: str) -> BadReply:
        return BadReply(f"{url}: malformed {what} reply: {msg}")

    if not isinstance(ids, list):
        raise bad(f"token ids must be a list, got {type(ids).__name__}")
    top = vocab_size if vocab_size else MAX_TOKEN_ID
    token_ids: list[int] = []
    for i, t in enumerate(ids):
        if ids_from_text and isinstance(t, str) and t.isascii() and t.isdigit():
            t = int(t)
        if isinstance(t, bool) or not isinstance(t, int):
            raise bad(f"token id {i} is {t!r} ({type(t).__name__}), not an integer")
        if not 0 <= t < top:
            bound = f"the vocabulary [0, {vocab_size})" if vocab_size else f"[0, {MAX_TOKEN_ID})"
            raise bad(f"token id {i} is {t}, outside {bound}")
        token_ids.append(t)
    if logprobs is None:
        return token_ids, []
    if not isinstance(logprobs, list):
        raise bad(f"logprobs must be a list, got {type(logprobs).__name__}")
    values: list[float] = []
    for i, x in enumerate(logprobs):
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise bad(f"logprob {i} is {x!r} ({type(x).__name__}), not a number")
        if not math.isfinite(x) or x > LOGPROB_SLACK:
            raise bad(f"logprob {i} is {x!r}; a log-probability is finite and <= 0")
        values.append(float(x))
    return token_ids, values


def parse_chat(payload: Any, url: str, tokenizer: Any, max_tokens: int | None = None) -> Completion:
    """A /v1/chat/completions JSON reply -> Completion (see "Chat mode" in the module docstring); a reply longer
    than `max_tokens` (the request's) could be is a BadReply."""
    def bad(what: str) -> EngineError:
        return EngineError(f"{url}: malformed chat reply: {what}")

    if not isinstance(payload, dict):
        raise bad(f"expected a JSON object, got {type(payload).__name__}")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad("no choices[0]")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict) or not isinstance(message.get("content") or "", str):
        raise bad("choices[0].message.content missing or not text")
    text = message.get("content") or ""
    if max_tokens is not None and len(text) > max_tokens * MAX_CHARS_PER_TOKEN:
        raise BadReply(f"{url}: malformed chat reply: {len(text):,} characters, more than max_tokens={max_tokens} "
                       f"tokens can hold ({MAX_CHARS_PER_TOKEN} each); the server ignored max_tokens")
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length", "abort"):
        raise bad(f"finish_reason {finish!r} (expected stop, length or abort)")
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    entries = content if isinstance(content, list) and all(isinstance(e, dict) for e in content) else None
    ids: Any = choice.get("token_ids")
    source = "server"
    from_text = False
    if ids is None and entries and all(str(e.get("token", "")).startswith("token_id:") for e in entries):
        ids = [str(e["token"])[len("token_id:"):] for e in entries]
        from_text = True
    if ids is None:
        if tokenizer is None:
            raise EngineError(f"{url}: the chat reply has no token ids and the engine has no tokenizer "
                              "to tokenize its text (set engine.model / OpenAIConfig.tokenizer)")
        ids = list(tokenizer.encode(message.get("content") or "", add_special_tokens=False))
        source = "text"
    token_ids, _ = check_reply_values(ids, None, url, "chat", _vocab_size(tokenizer), from_text)
    values: list[float] | None = None
    if source == "server" and entries is not None and len(entries) == len(token_ids):
        if all("logprob" in e for e in entries):
            _, values = check_reply_values(token_ids, [e["logprob"] for e in entries], url, "chat")
    info = {"token_ids": source, "logprobs": "server" if values is not None else "unavailable"}
    if values is None:  # placeholders: Segment requires finite logprobs; training never gets here
        values = [0.0] * len(token_ids)
    return Completion(token_ids, values, finish, info=info)


def _vocab_size(tokenizer: Any) -> int | None:
    """len(tokenizer) (the vocabulary with added tokens) when the tokenizer says; else None."""
    try:
        return int(len(tokenizer)) if tokenizer is not None else None
    except TypeError:  # a tokenizer without __len__ (a test double)
        return None


def parse_completion(payload: Any, url: str, vocab_size: int | None = None) -> Completion:
    """A /v1/completions JSON reply -> Completion; any missing or inconsistent field is an EngineError."""
    def bad(what: str) -> EngineError:
        return EngineError(f"{url}: malformed completion reply: {what}")

    if not isinstance(payload, dict):
        raise bad(f"expected a JSON object, got {type(payload).__name__}")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad("no choices[0]")
    choice = choices[0]
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
        raise bad("choices[0].logprobs.token_logprobs missing (was logprobs requested?)")
    logprobs = lp["token_logprobs"]
    ids = choice.get("token_ids")
    if ids is None:
        tokens = lp.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise bad("no token ids: neither choices[0].token_ids nor 'token_id:N' logprob tokens")
        ids = [t[len("token_id:") :] for t in tokens]
    token_ids, values = check_reply_values(ids, logprobs, url, "completion", vocab_size,
                                           ids_from_text=choice.get("token_ids") is None)
    if len(token_ids) != len(values):
        raise bad(f"{len(token_ids)} token ids but {len(values)} logprobs")
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length", "abort"):
        raise bad(f"finish_reason {finish!r} (expected stop, length or abort)")
    return Completion(token_ids, values, finish)


def _one_line(text: str, limit: int = 300) -> str:
    """A server's error text on one line (JSON error bodies: their message)."""
    try:
        payload = json.loads(text)
        err = payload.get("error", payload) if isinstance(payload, dict) else payload
        msg = err.get("message", err.get("detail", text)) if isinstance(err, dict) else str(err)
    except (json.JSONDecodeError, ValueError, AttributeError):
        msg = text
    return " ".join(str(msg).split())[:limit]


class _Retryable(Exception):
    """An attempt failed in a way worth retrying (connection, timeout, 5xx)."""


class OpenAIEngine:
    """The Engine protocol over an OpenAI-compatible server (see the module docstring)."""

    capabilities = Capabilities(adapters=True)

    def __init__(self, config: OpenAIConfig | None = None, tokenizer: Any = None, **kwargs: Any) -> None:
        self.config = config if config is not None else OpenAIConfig(**kwargs)
        if config is not None and kwargs:
            raise TypeError("OpenAIEngine takes an OpenAIConfig or keyword fields, not both")
        self.root = _root(self.config.base_url)
        self.url = f"{self.root}{ENDPOINTS[self.config.api]}"
        if tokenizer is None and self.config.tokenizer:

            tokenizer = AutoTokenizer.from_pretrained(self.config.tokenizer)
        self.tokenizer = tokenizer
        env = self.config.api_key_env
        key = self.config.api_key or (os.environ.get(env) if env else None)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        # One client for the run: its pooled connections and the semaphore belong to the run's loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._sem: asyncio.Semaphore | None = None
        self._adapter: str | None = None  # the LoRA adapter requests name (load_adapter)
        self._adapter_tag = uuid.uuid4().hex[:8]
        self._adapter_version = 0
        self._listed: str | None = None  # api=chat without a served model: the server's one model, asked once
        self._model_task: asyncio.Future[None] | None = None  # per client (loop): the concurrent calls share it
        self.bad_replies = 0
        """Replies refused by check_reply_values (each logged; retried up to max_retries)."""

    @property
    def served_model(self) -> str | None:
        """What requests send as `model`: the current LoRA adapter, else OpenAIConfig.model, else (chat
        requests) the one model the server lists (`_ask_model`)."""
        return self._adapter or self.config.model or self._listed

    async def _ask_model(self, client: Any) -> None:
        """api=chat with no engine.openai.served_model: servers of the vLLM 0.7 era (MemAgent's serve/llm070.py)
        require `model` in a chat request, so take the server's only model from GET /v1/models, once. Several
        models is a one-line error naming the setting; a server without the endpoint gets no `model`, as before."""
        url = f"{self.root}/v1/models"
        try:
            resp = await client.get(url)
        except httpx.HTTPError as e:
            log.warning("%s: %s; chat requests are sent without a model name", url, e)
            return
        if resp.status_code >= 400:
            log.warning("%s: HTTP %d; chat requests are sent without a model name", url, resp.status_code)
            return
        try:
            ids = [str(m["id"]) for m in resp.json()["data"]]
        except (ValueError, KeyError, TypeError) as e:
            raise EngineError(f"{url}: malformed model list (expected {{\"data\": [{{\"id\": ...}}]}}): "
                              f"{resp.text[:200]!r}") from e
        if len(ids) > 1:
            raise EngineError(f"{url} serves {len(ids)} models ({', '.join(ids)}); set engine.openai.served_model "
                              "to the one to evaluate")
        self._listed = ids[0] if ids else None

    def _timeout(self) -> Any:
        c = self.config
        return httpx.Timeout(c.timeout_s, connect=c.connect_timeout_s)

    def _state(self) -> tuple[Any, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is not None and self._sem is not None:
            if self._loop is not loop:
                raise EngineError(f"{self.url}: the engine's HTTP client belongs to another event loop; run every "
                                  "rollout of a run on one loop (memrl.runtime.RolloutRuntime) or close() the "
                                  "engine before using it from a new one")
            return self._client, self._sem
        self._loop = loop
        n = self.config.max_concurrency
        self._client = httpx.AsyncClient(
            timeout=self._timeout(),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            headers=self._headers,
        )
        self._sem = asyncio.Semaphore(n)
        return self._client, self._sem

    async def _post_once(self, client: Any, body: dict[str, Any]) -> Any:
        try:
            async with client.stream("POST", self.url, json=body) as resp:
                status, data = resp.status_code, bytearray()
                async for chunk in resp.aiter_bytes():  # read up to MAX_REPLY_BYTES, never the whole of a flood
                    data += chunk
                    if len(data) > MAX_REPLY_BYTES:
                        raise EngineError(f"{self.url}: the reply is larger than {MAX_REPLY_BYTES:,} bytes; "
                                          "refused unread")
        except httpx.TimeoutException as e:
            raise _Retryable(f"timed out ({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise _Retryable(f"unreachable ({type(e).__name__}: {e})") from e
        text = data.decode("utf-8", errors="replace")
        if status >= 500:
            raise _Retryable(f"HTTP {status}: {text[:300]}")
        if status == 404 and self.config.api == "completions":
            raise EngineError(f"{self.url}: HTTP 404: {text[:200]} (no /v1/completions here; a chat-only "
                              "server such as MemAgent's serve/llm070.py needs engine.openai.api=chat, eval only)")
        if status >= 400:
            raise EngineError(f"{self.url}: HTTP {status}: {text[:500]}")
        try:
            return json.loads(data)
        except (json.JSONDecodeError, ValueError) as e:
            raise EngineError(f"{self.url}: malformed completion reply: not JSON ({text[:200]!r})") from e

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """One completion; at most max_concurrency in flight, retried on transient failures."""
        if not prompt_ids:
            raise EngineError(f"{self.url}: empty prompt")
        messages = getattr(prompt_ids, "messages", None)
        if self.config.api == "chat" and messages is None:
            raise EngineError(f"{self.url}: engine.openai.api=chat sends chat messages, but this prompt was "
                              "built as token ids (MemAct's working context is); use engine.openai.api=completions")
        client, sem = self._state()
        if self.config.api == "chat" and not (self._adapter or self.config.model):
            if self._model_task is None:
                self._model_task = asyncio.ensure_future(self._ask_model(client))
            await self._model_task
        if self.config.api == "chat":
            body = chat_request(messages, sampling, self.served_model, getattr(prompt_ids, "template_kwargs", None))
        else:
            body = completion_request(prompt_ids, sampling, self.served_model)
        attempts = self.config.max_retries + 1
        async with sem:
            for attempt in range(attempts):
                try:
                    payload = await self._post_once(client, body)
                    if self.config.api == "chat":
                        return parse_chat(payload, self.url, self.tokenizer, sampling.max_tokens)
                    return parse_completion(payload, self.url, _vocab_size(self.tokenizer))
                except BadReply as e:  # garbage values: counted, logged, retried like a transient failure
                    self.bad_replies += 1
                    if attempt + 1 == attempts:
                        raise BadReply(f"{e} (gave up after {attempts} attempts)") from e
                    log.warning("%s; retry %d/%d", e, attempt + 1, attempts - 1)
                    continue
                except _Retryable as e:
                    if attempt + 1 == attempts:
                        raise EngineError(f"{self.url}: {e} (gave up after {attempts} attempts)") from e
                    delay = self.config.backoff_s * (2**attempt) * (1 + 0.1 * random.random())
                    log.warning("%s: %s; retry %d/%d in %.2fs", self.url, e, attempt + 1, attempts - 1, delay)
                    await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def update_weights(self, weights: Mapping[str, Any] | str) -> None:
        """Make the server reload weights from a checkpoint directory on its own filesystem.

        vLLM needs VLLM_SERVER_DEV_MODE=1 (/collective_rpc with `vllm_reload_method`, then
        /reset_prefix_cache); SGLang uses /update_weights_from_disk. State dicts cannot go over HTTP:
        save a checkpoint and pass its directory.
        """
        if not isinstance(weights, (str, os.PathLike)):
            raise EngineError(
                f"{self.root}: update_weights over HTTP takes a checkpoint directory, not a state dict"
            )
        path = os.fspath(weights)
        if self.config.server == "vllm":
            method = self.config.vllm_reload_method
            kwargs = {"weights_path": path} if method == "reload_weights" else {"path": path}
            calls = [
                (f"{self.root}/collective_rpc", {"method": method, "kwargs": kwargs}),
                (f"{self.root}/reset_prefix_cache", None),
            ]
        else:
            calls = [(f"{self.root}/update_weights_from_disk", {"model_path": path})]
        with httpx.Client(timeout=self._timeout(), headers=self._headers) as client:
            for url, body in calls:
                try:
                    resp = client.post(url, json=body) if body is not None else client.post(url)
                except httpx.TransportError as e:
                    raise EngineError(f"{url}: unreachable ({type(e).__name__}: {e})") from e
                if resp.status_code == 404:
                    hint = " (start vLLM with VLLM_SERVER_DEV_MODE=1)" if self.config.server == "vllm" else ""
                    raise EngineError(f"{url}: not found{hint}")
                if resp.status_code >= 400:
                    raise EngineError(f"{url}: HTTP {resp.status_code}: {resp.text[:500]}")

    def load_adapter(self, path: str | os.PathLike) -> str:
        """Load the PEFT-format adapter directory `path` (on the server's filesystem) under a new name, send
        it as every request's `model` from now on, and unload the previous adapter; returns the name."""
        if self.config.server != "vllm":
            raise EngineError(f"{self.root}: load_adapter needs a vLLM server (OpenAIConfig.server=vllm)")
        self._adapter_version += 1
        name = f"memrl-lora-{self._adapter_tag}-{self._adapter_version}"
        self._post_admin("/v1/load_lora_adapter", {"lora_name": name, "lora_path": os.fspath(path)})
        old, self._adapter = self._adapter, name
        if old is not None:
            self._post_admin("/v1/unload_lora_adapter", {"lora_name": old})
        return name

    def unload_adapter(self) -> None:
        """Unload the current adapter (if any): requests name the base model again."""
        old, self._adapter = self._adapter, None
        if old is not None:
            self._post_admin("/v1/unload_lora_adapter", {"lora_name": old})

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter requests name (None: the base model)."""
        return self._adapter

    def _post_admin(self, endpoint: str, body: dict[str, Any]) -> None:
        """POST a LoRA admin call; any refusal is one line naming the endpoint."""
        url = f"{self.root}{endpoint}"
        with httpx.Client(timeout=self._timeout(), headers=self._headers) as client:
            try:
                resp = client.post(url, json=body)
            except httpx.TransportError as e:
                raise EngineError(f"{url}: unreachable ({type(e).__name__}: {e})") from e
        if resp.status_code in (404, 405) and _one_line(resp.text) in ("Not Found", "Method Not Allowed"):
            raise EngineError(f"{url}: not found (start vLLM with --enable-lora and "  # no such route
                              "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
        if resp.status_code >= 400:
            raise EngineError(f"{url}: HTTP {resp.status_code}: {_one_line(resp.text)}")

    async def health(self) -> bool:
        """True when GET /health answers 200."""
        client, _ = self._state()
        try:
            return (await client.get(f"{self.root}/health")).status_code == 200
        except httpx.TransportError:
            return False

    async def close(self) -> None:
        """Close the pooled client (the engine may be used again afterwards, from any loop)."""
        client, self._client, self._loop, self._sem = self._client, None, None, None
        self._model_task = None
        if client is not None:
            try:
                await client.aclose()
            except RuntimeError:  # its loop is gone; nothing left to close
                pass
