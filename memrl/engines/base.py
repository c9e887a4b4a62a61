"""The engine protocol every inference backend implements.

Logprob convention (shared by every engine and the trainer): a returned logprob is the log-probability
of the sampled token under softmax(logits / T), with T the sampling temperature (T = 1 when greedy,
temperature 0), *before* top-k / top-p truncation. The trainer recomputes log_softmax(logits / T) on the
same tokens, so old and new logprobs agree exactly when the weights are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from memrl.config import MAX_SEED, MAX_TEMPERATURE, MAX_TOKENS, MAX_VOCAB, valid

FAILED_REQUEST_MODES = ("error", "drop", "drop_or_empty")
"""What an evaluation does with a question whose request raised EngineError (memrl eval / val.failed_requests)."""


class EngineError(RuntimeError):
    """An engine could not serve a request (unreachable server, malformed reply, bad request)."""


class NonFiniteLogprobError(EngineError):
    """The model produced a NaN / inf log-probability: its weights hold NaN or inf."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. temperature 0 means greedy; top_k <= 0 and top_p = 1 disable them."""

    temperature: float = valid(1.0, ge=0, le=MAX_TEMPERATURE, note="0 = greedy")
    top_p: float = valid(1.0, gt=0, le=1, note="1 = off")
    top_k: int = valid(-1, ge=-1, le=MAX_VOCAB, note="-1 or 0 = off")
    max_tokens: int = valid(256, ge=1, le=MAX_TOKENS)
    stop_token_ids: tuple[int, ...] = valid((), ge=0, le=MAX_VOCAB)
    seed: int | None = valid(None, ge=0, le=MAX_SEED)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The temperature that logprobs are computed under (1 for greedy)."""
        return self.temperature if self.temperature > 0 else 1.0

    def replace(self, **kw: Any) -> SamplingParams:
        return replace(self, **kw)


class ChatPrompt(list):
    """The token ids of a prompt rendered from chat messages, carrying those messages (`.messages`).

    Every engine takes it as the list of ids it is; the OpenAI engine in chat mode
    (engine.openai.api=chat) sends the messages to /v1/chat/completions instead, since a chat server
    renders the template itself; `template_kwargs` (e.g. {"enable_thinking": False}) go with them as the
    request's chat_template_kwargs. Prompts built from token ids (MemAct's working context) are plain lists.
    """

    def __init__(self, ids: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(ids)
        self.messages = messages
        self.template_kwargs = dict(template_kwargs or {})


@dataclass
class Completion:
    """What an engine returns: generated token ids, their logprobs, and why generation stopped.

    finish_reason is "stop" (a stop token was produced; it is included in token_ids) or "length".
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise EngineError(
                f"Completion has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs"
            )
        if self.finish_reason not in ("stop", "length", "abort"):
            raise EngineError(f"Completion.finish_reason must be stop/length/abort, got {self.finish_reason!r}")


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond the Engine protocol, declared by the engine class (`capabilities`) so
    callers ask `capabilities(engine)` instead of probing for methods."""

    sleep: bool = False
    """`sleep(level)` / `wake_up()`: free and restore its GPU memory between rollouts (vLLM's sleep mode)."""
    weight_transfer: bool = False
    """`transfer_members`, `init_weight_transfer(spec, first_rank)`, `receive_weights()`: weights by
    collective broadcast from the trainer (memrl.engines.weight_transfer)."""
    busy_accounting: bool = False
    """`busy_seconds() -> (seconds spent generating, replicas)` (the trainer's perf/engine_idle_share)."""
    adapters: bool = False
    """`load_adapter(path) -> name`: serve a LoRA adapter directory (engine.*.lora_sync=adapter)."""


PLAIN = Capabilities()
"""An engine that declares nothing: the protocol only (test doubles, wrappers)."""


def capabilities(engine: Any) -> Capabilities:
    """What `engine` declares it can do (PLAIN when it declares nothing)."""
    declared = getattr(type(engine), "capabilities", PLAIN)
    return declared if isinstance(declared, Capabilities) else PLAIN


@runtime_checkable
class Engine(Protocol):
    """Token in, token out. Concurrent `generate` calls are batched by the engine itself.

    What an engine can do beyond this it declares as `capabilities` (a Capabilities: sleep, weight transfer
    by broadcast, busy accounting, adapters), read through `capabilities(engine)`."""

    tokenizer: Any

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion: ...

    def update_weights(self, weights: Mapping[str, Any] | str) -> None:
        """Load new weights: a state dict (name -> tensor) or a HuggingFace checkpoint directory."""
        ...

    async def close(self) -> None: ...
