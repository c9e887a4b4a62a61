"""Pieces every chunked-memory workflow shares (MemAgent, ReMemR1): the common config fields and their
sampling, cutting the context into chunks, and one model call recorded as a training segment."""

from __future__ import annotations

import logging
import random
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from memrl.config import MAX_COUNT, MAX_TEMPERATURE, MAX_TOKENS, MAX_VOCAB, valid
from memrl.engines.base import Completion, Engine, SamplingParams
from memrl.engines.versioned import VERSION_KEY
from memrl.quiet import encode_document
from memrl.rewards.verifiers import check_verifier
from memrl.types import Segment, Task
from memrl.workflows.templates import (
    TEMPLATE_STYLES,
    Template,
    chat_prompt,
    load_template,
    spliced_chat_prompt,
)

log = logging.getLogger(__name__)

NO_MEMORY = "No previous memory"
TRUNCATIONS: tuple[str, ...] = ("centre", "head")
EMPTY_MEMORY_RULES: tuple[str, ...] = ("placeholder", "keep_previous", "empty")
MEMORY_TEXTS: tuple[str, ...] = ("reply", "after_think", "strip_think")
PROMPT_ASSEMBLIES: tuple[str, ...] = ("text", "spliced")
THINK_OPEN, THINK_END = "<think>", "</think>"
READING: ContextVar = ContextVar("memrl_reading", default=None)
"""An observer of the chunked loop in this context (`memrl ask`'s progress bar and streamed memories), or None
(everywhere else): its `chunks(n)` is called once a task's document is cut into n chunks, its `segment(seg)`
after each model call (a memory step, then the final answer). It watches; it changes nothing."""
_THINK_BLOCK = re.compile(re.escape(THINK_OPEN) + r".*?" + re.escape(THINK_END), re.DOTALL)


def after_think(reply: str) -> str:
    """The published evaluation's memory (utils/__init__.py extract_solution, FORCE_THINK unset): the text
    after the reply's last `</think>`, whitespace-trimmed; a reply without `</think>` is kept whole."""
    if THINK_END not in reply:
        return reply
    return reply.rsplit(THINK_END, 1)[1].strip()


def strip_think(reply: str) -> str:
    """The reply without its reasoning, whitespace-trimmed: every `<think>...</think>` block cut out; then
    the text up to a `</think>` left without its `<think>` (a template that opens the block in the prompt)
    and the text from a `<think>` left unclosed (a reply cut at its token budget) cut too."""
    text = _THINK_BLOCK.sub("", reply)
    if THINK_END in text:
        text = text.rsplit(THINK_END, 1)[1]
    if THINK_OPEN in text:
        text = text.split(THINK_OPEN, 1)[0]
    return text.strip()


def think_text_rule(reply: str, rule: str) -> str:
    """What a memory call's reply is read as under `memory_text` (ChunkedConfig): reply (as it is),
    after_think or strip_think (above)."""
    if rule == "after_think":
        return after_think(reply)
    if rule == "strip_think":
        return strip_think(reply)
    if rule != "reply":
        raise ValueError(f"memory_text must be one of {', '.join(MEMORY_TEXTS)}, got {rule!r}")
    return reply


@dataclass
class ChunkedConfig:
    """Settings of the chunk-by-chunk memory loop (defaults: MemAgent's published values)."""

    chunk_tokens: int = valid(5000, ge=1, le=MAX_TOKENS)
    """Tokens of context per memory call (contiguous, non-overlapping, ignoring document boundaries)."""
    max_chunks: int = valid(0, ge=0, le=MAX_COUNT, note="0 = no cap")
    """Cap on chunks (cut as `truncation` says); 0 = no cap (evaluation). The published training recipes
    use 8."""
    max_memory_tokens: int = valid(1024, ge=1, le=MAX_TOKENS)
    """Generation budget of a memory call."""
    max_final_tokens: int = valid(1024, ge=1, le=MAX_TOKENS)
    """Generation budget of the final answer call."""
    temperature: float = valid(1.0, ge=0, le=MAX_TEMPERATURE, note="0 = greedy")
    top_p: float = valid(1.0, gt=0, le=1, note="1 = off")
    top_k: int = valid(-1, ge=-1, le=MAX_VOCAB, note="-1 or 0 = off")
    no_memory_text: str = NO_MEMORY
    """The first memory, and what an empty memory becomes under empty_memory=placeholder."""
    enable_thinking: bool | None = None
    """The chat template's thinking switch (Qwen3's `enable_thinking`) for every call: None = the
    template's default (Qwen3: thinking on); false = a non-thinking prompt (Qwen3 adds an empty think
    block); true on a template without the switch is refused once the tokenizer loads (it would do nothing).
    See memory_text for the <think> text of a reply."""
    memory_text: str = valid("reply", choices=MEMORY_TEXTS)
    """What of a memory call's reply the memory is read from, i.e. where a thinking model's <think> text
    goes: reply (kept: the whole decoded reply; memrl, and MemAgent's trainers), after_think (the text
    after the last </think>, trimmed, the whole reply when it has none: MemAgent's published evaluation,
    taskutils/memory_eval/utils/recurrent.py via utils/__init__.py extract_solution) or strip_think (every
    <think>...</think> block cut out, and a block opened by the prompt or left unclosed; trimmed).
    ReMemR1 parses its <update> / <recall> tags from what is left. empty_memory then applies."""

    # Published-setup switches (memrl's default first; docs/DIFFERENCES.md).
    template_style: str = valid("memrl", choices=TEMPLATE_STYLES)
    """How a user's template (inline or file) is read: memrl (literal {name} substitution, other braces
    are text) or str_format (a Python str.format string as the published code writes it: {{ }} escapes,
    {prompt} = {problem}). The packaged default templates are always memrl style."""
    template_strip: bool = False
    """A template file: False keeps its text exactly (a published template ends with a newline); True
    reads it as memrl did before (line endings as \\n, one final newline dropped)."""
    truncation: str = valid("centre", choices=TRUNCATIONS)
    """How max_chunks cuts a long context: centre (keep the head half and the tail half: MemAgent, memrl)
    or head (keep the first max_chunks chunks: vime)."""
    empty_memory: str = valid("placeholder", choices=EMPTY_MEMORY_RULES)
    """A memory call whose memory is empty (after special tokens and surrounding whitespace are removed):
    placeholder (no_memory_text: MemAgent), keep_previous (the previous memory stays: vime) or empty (the
    empty string: MemAgent's synchronous trainer, ReMemR1's released code)."""
    reward: str = "boxed_em"
    """Outcome verifier (memrl.rewards.verifiers): boxed_em = memrl's exact match of the last \\boxed{}
    over the whole text, best over all golds; verl_hotpotqa = the published MemAgent/ReMemR1 verifier
    (last 300 characters, its strip_string, also the `\\boxed ans` form); published_box_f1 = that verifier's
    answer scored by token F1 (a denser training reward); format_f1 = half for one non-empty box, half for
    the reply's token F1 (a training reward while the box is unlearned); box_weighted_f1 = the reply's token
    F1, weighted 1 when boxed and 0.25 when not (no credit for a box alone); or package.module:fn, your own
    function marked with @memrl.rewards.verifiers.verifier."""
    prompt_assembly: str = valid("text", choices=PROMPT_ASSEMBLIES)
    """How a call's prompt ids are made. text (memrl): the template rendered to text and encoded once through
    the chat template. spliced: the published synchronous trainers' TokenTemplate (MemAgent
    recurrent/impls/memory.py, ReMemR1 recurrent/impls/memory_revisit.py): the chat-framed template's
    literal pieces encoded one by one, the question and each text value encoded on their own, the chunk's
    ids as cut from the context, and (MemAgent, memory_text=reply) the memory as the previous reply's ids
    without its EOS and pad ids, not decoded; a memory from memrl's own rules (after_think / strip_think,
    the placeholder) is its text encoded on its own (memrl.workflows.templates.spliced_chat_prompt). The
    chat frame is rendered with enable_thinking, so a thinking template's generation prompt is the last
    piece. Needs template_style=memrl."""
    require_template_files: bool = False
    """True: refuse to run without the user's own prompts (memory_template_file and final_template_file,
    or the inline memory_template / final_template). The published-recipe presets set it: their prompts
    are the published text, which memrl does not ship, so memrl's default wording would silently stand in."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_verifier(self.reward, f"{name}.reward")  # a registered name or module:fn of a @verifier
        for f in ("chunk_tokens", "max_memory_tokens", "max_final_tokens"):
            if getattr(self, f) < 1:
                raise ValueError(f"{name}.{f} must be >= 1, got {getattr(self, f)}")
        if self.max_chunks < 0:
            raise ValueError(f"{name}.max_chunks must be >= 0, got {self.max_chunks}")
        for f, allowed in (("template_style", TEMPLATE_STYLES), ("truncation", TRUNCATIONS),
                           ("empty_memory", EMPTY_MEMORY_RULES), ("memory_text", MEMORY_TEXTS),
                           ("prompt_assembly", PROMPT_ASSEMBLIES)):
            if getattr(self, f) not in allowed:
                raise ValueError(f"{name}.{f} must be one of {', '.join(allowed)}, got {getattr(self, f)!r}")
        if self.prompt_assembly == "spliced" and self.template_style != "memrl":
            raise ValueError(f"{name}.prompt_assembly=spliced cuts memrl-style templates at their placeholders (the "
                             f"published TokenTemplate never applies str.format): needs template_style=memrl, got "
                             f"{self.template_style!r}")
        if self.require_template_files:
            for kind in ("memory", "final"):
                given = (getattr(self, f"{kind}_template_file", None), getattr(self, f"{kind}_template", None))
                if given == (None, None):
                    raise ValueError(
                        f"workflow.{kind}_template_file is required (workflow.require_template_files=true, set by "
                        f"the published-recipe presets): save the published {kind} prompt to a file and pass "
                        f"workflow.{kind}_template_file=FILE")

    def load_template(self, default_name: str, placeholders: tuple[str, ...], path: str | None,
                      text: str | None) -> Template:
        """A prompt template read under this config's template_style / template_strip."""
        return load_template(default_name, placeholders, path, text, self.template_style, self.template_strip)

    def memory_after(self, new_memory: str | None, previous: str) -> str:
        """The memory a call leaves: its own when non-empty, else what `empty_memory` says."""
        if new_memory:
            return new_memory
        if self.empty_memory == "keep_previous":
            return previous
        return "" if self.empty_memory == "empty" else self.no_memory_text

    def sampling(self, max_tokens: int, rng: random.Random) -> SamplingParams:
        """One call's sampling; a sampled call draws its seed from the trajectory's rng."""
        seed = rng.getrandbits(31) if self.temperature > 0 else None
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_tokens=max_tokens, seed=seed
        )


def centre_truncate(ids: list[int], limit: int) -> list[int]:
    """Keep the first ceil(limit/2) and the last floor(limit/2) tokens when ids is longer than limit."""
    if limit <= 0 or len(ids) <= limit:
        return ids
    head = (limit + 1) // 2
    tail = limit - head
    return ids[:head] + (ids[len(ids) - tail :] if tail else [])


def chunk_context(context_ids: list[int], chunk_tokens: int, max_chunks: int = 0,
                  truncation: str = "centre") -> tuple[list[list[int]], bool]:
    """Cut token ids into contiguous chunks of chunk_tokens (last may be shorter); (chunks, truncated).

    Over max_chunks chunks, `centre` keeps the head and tail halves of max_chunks * chunk_tokens tokens
    (then chunks them), `head` the first max_chunks chunks (vime's `chunks[:MAX_CHUNKS]`).
    """
    limit = max_chunks * chunk_tokens if max_chunks else 0
    if truncation == "head":
        kept = context_ids[:limit] if limit else context_ids
    elif truncation == "centre":
        kept = centre_truncate(context_ids, limit)
    else:
        raise ValueError(f"unknown truncation {truncation!r}; expected one of {', '.join(TRUNCATIONS)}")
    chunks = [kept[i : i + chunk_tokens] for i in range(0, len(kept), chunk_tokens)]
    return chunks, len(kept) < len(context_ids)


def task_chunks(task: Task, tokenizer: Any, cfg: ChunkedConfig) -> tuple[list[int], list[list[int]], bool]:
    """(context ids, chunks, truncated) of a task's context under `cfg`; an empty context is logged."""
    # The whole document, longer than model_max_length on purpose: it is chunked below.
    context_ids = encode_document(tokenizer, task.context) if task.context else []
    chunks, truncated = chunk_context(context_ids, cfg.chunk_tokens, cfg.max_chunks, cfg.truncation)
    if not chunks:
        log.warning("task %s has an empty context: answering from the empty memory", task.task_id)
    if (observer := READING.get()) is not None:
        observer.chunks(len(chunks))
    return context_ids, chunks, truncated


def decode_response(tokenizer: Any, token_ids: list[int]) -> str:
    """Generated text without EOS/pad or other special tokens, whitespace-trimmed."""
    return tokenizer.decode(token_ids, skip_special_tokens=True).strip()


async def call_model(engine: Engine, user_text: str, sampling: SamplingParams,
                     enable_thinking: bool | None = None) -> tuple[list[int], Completion, str]:
    """One single-turn chat call: (prompt ids, the completion, its decoded text)."""
    _, prompt_ids = chat_prompt(engine.tokenizer, user_text, enable_thinking)
    out = await engine.generate(prompt_ids, sampling)
    return prompt_ids, out, decode_response(engine.tokenizer, out.token_ids)


def template_prompt_ids(tokenizer: Any, template: Template, assembly: str, enable_thinking: bool | None = None,
                        **values: str | list[int]) -> list[int]:
    """The prompt ids `call_template` would send for `template` filled with `values`, without calling a
    model (InfoMem's no-memory prompt is built so)."""
    if assembly == "spliced":
        return spliced_chat_prompt(tokenizer, template, enable_thinking, **values)
    text = {k: v if isinstance(v, str) else tokenizer.decode(v) for k, v in values.items()}
    return chat_prompt(tokenizer, template.render(**text), enable_thinking)[1]


async def call_template(engine: Engine, template: Template, sampling: SamplingParams, assembly: str,
                        enable_thinking: bool | None = None,
                        **values: str | list[int]) -> tuple[list[int], Completion, str]:
    """One single-turn call on `template` filled with `values` (a list of ids: a chunk, or a memory under
    spliced): (prompt ids, the completion, its decoded text). `assembly` is ChunkedConfig.prompt_assembly:
    text renders the text (ids decoded) and encodes it at once; spliced joins separately encoded pieces.
    `enable_thinking` (ChunkedConfig's) goes to the chat template either way."""
    if assembly == "spliced":
        prompt_ids = spliced_chat_prompt(engine.tokenizer, template, enable_thinking, **values)
        out = await engine.generate(prompt_ids, sampling)
        return prompt_ids, out, decode_response(engine.tokenizer, out.token_ids)
    text = {k: v if isinstance(v, str) else engine.tokenizer.decode(v) for k, v in values.items()}
    return await call_model(engine, template.render(**text), sampling, enable_thinking)


def reply_ids(tokenizer: Any, token_ids: list[int]) -> list[int]:
    """A reply's ids as the published synchronous trainers keep them for the memory (recurrent/utils.py unpad
    with remove_eos): every EOS and pad id dropped, wherever it sits; nothing decoded."""
    drop = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
    return [i for i in token_ids if i not in drop]


def call_segment(prompt_ids: list[int], out: Completion, step: int, info: dict[str, Any]) -> Segment:
    """The training segment of one call; `info` gets the completion's finish_reason last."""
    seg = Segment(prompt_ids=prompt_ids, response_ids=list(out.token_ids), response_logprobs=list(out.logprobs),
                  step=step, info={**info, "finish_reason": out.finish_reason})
    if VERSION_KEY in out.info:  # asynchronous training: the policy version this call ran under
        seg.info[VERSION_KEY] = out.info[VERSION_KEY]
    seg.routing = out.info.get("routing")  # MoE routing replay r3 (memrl.training.update.routing.ROUTING_KEY)
    if (observer := READING.get()) is not None:
        observer.segment(seg)
    return seg


def loop_metrics(context_ids: list[int], chunks: list[list[int]], truncated: bool, memory_lengths: list[int],
                 boxed: str | None, segments: list[Segment]) -> dict[str, float]:
    """The metrics every chunked trajectory reports (reading, memory length, answer format, tokens)."""
    n = len(chunks)
    return {
        "num_chunks": float(n),
        "context_tokens": float(len(context_ids)),
        "tokens_read": float(sum(len(c) for c in chunks)),
        "truncated": float(truncated),
        "memory_tokens_mean": sum(memory_lengths) / len(memory_lengths) if memory_lengths else 0.0,
        "no_box": float(boxed is None),
        "generated_tokens": float(sum(len(s.response_ids) for s in segments)),
    }
