"""The shared loop of the context-management family (fold, summarize, sliding_window): a search agent over a
message-level working context.

As MemAct's (memrl.workflows.memact): each assistant turn sees the working context (system + user, then kept
assistant turns, tool results and the user messages the workflow inserts) and answers with tool calls (Hermes JSON
or xml, `tool_call_format`; `search`, plus the workflow's own tools) or, with no call, the final answer (`FINAL_ANSWER: ...`). The
context is a list of memrl.tools.context messages each holding its ids: generated ids exactly as sampled,
tool results and inserted user messages tokenized once; a fold, a summary restart or a window shift removes
messages and never re-tokenizes. A model call whose context (prompt) would pass `max_context_tokens` is not
made: the thread stops there (the budget every member is compared at); with `response_budget` the published
FoldAgent limit applies instead (the thread's first prompt plus that many tokens, each call capped to fit).
A first prompt already over the budget is said on the console (a warning naming the task), never a silent
empty run.

A training row (Segment) is cut by `thread_row` from a snapshot of the context: the prompt is the context up
to the first assistant turn of the row (its role header included), the response the rest, mask 1 only on
sampled ids, so each row trains on exactly the context its turns were sampled in and no turn trains twice.
Each row's `info["turn_spans"]` lists `[turn, start, end]` of the sampled ids of its turns (response offsets),
which token-level rewards (memrl.rewards.fold) read.

Per-trajectory metrics every member reports: turns, generated_tokens, peak / mean / final working context
(`peak_context_tokens`; `context_tokens` = the peak, the eval table's column), tokens_discarded (ids removed
from a working context by folds, summaries or window shifts), and the members' own counts (branches, folds,
summaries, window_drops).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from dataclasses import dataclass
from typing import Any

from memrl.config import MAX_CHARS, MAX_COUNT, MAX_TEMPERATURE, MAX_TOKENS, MAX_VOCAB, valid
from memrl.engines.base import Engine, SamplingParams
from memrl.engines.versioned import VERSION_KEY
from memrl.quiet import encode_pieces, encode_rendered
from memrl.rewards.multiq import MARKER, PUBLISHED_MARKER, answer_format, final_answer_text
from memrl.tools import calls as tc
from memrl.tools import context as ctx
from memrl.tools import search as ts
from memrl.types import Segment, Task, Trajectory
from memrl.workflows.chunked import decode_response
from memrl.workflows.templates import load_template, template_kwargs

_USER_SENTINEL = "\u2063USER\u2063"
BASE_COUNTERS = ("searches", "search_errors", "malformed_calls", "unknown_tools", "bad_arguments",
                 "dropped_calls", "tool_truncations", "topk_clamped")

log = logging.getLogger(__name__)


@dataclass
class SearchAgentConfig:
    """Settings every member of the family shares (memrl's defaults)."""

    max_assistant_turns: int = valid(40, ge=1, le=MAX_COUNT)
    """Assistant turns per trajectory, all threads together (a fold's branch turns count too)."""
    max_turn_tokens: int = valid(2048, ge=1, le=MAX_TOKENS)
    """Generation budget of one assistant turn."""
    max_context_tokens: int = valid(32768, ge=1, le=MAX_TOKENS)
    """The working-context budget: a model call whose prompt would pass it is not made (its thread stops)."""
    response_budget: int = valid(0, ge=0, le=MAX_TOKENS, note="0 = off: max_context_tokens alone")
    """> 0: each thread may grow to its first prompt plus this many tokens (and never past
    max_context_tokens): a call generates at most what is left of that limit, and a call with fewer than
    `min_call_tokens` left is not made (its thread stops). Published FoldAgent: agents/utils.py `Agent.step`
    (max_len = the first prompt + response_length 32768) and `CallLLM._create_completion` (max_tokens =
    max_len - prompt, skipped below 10). 0: a call is refused only when its prompt passes max_context_tokens,
    and it may then generate its whole max_turn_tokens."""
    min_call_tokens: int = valid(1, ge=1, le=MAX_TOKENS)
    """With response_budget: the fewest tokens a call must have left to be made (published: 10)."""
    max_tool_response_chars: int = valid(8192, ge=1, le=MAX_CHARS)
    """Tool output longer than this is cut in the middle."""
    max_parallel_calls: int = valid(5, ge=1, le=MAX_COUNT)
    """Tool calls executed per turn; further well-formed calls are dropped (counted) with an error reply."""
    temperature: float = valid(1.0, ge=0, le=MAX_TEMPERATURE, note="0 = greedy")
    top_p: float = valid(1.0, gt=0, le=1, note="1 = off")
    top_k: int = valid(-1, ge=-1, le=MAX_VOCAB, note="-1 or 0 = off")
    retriever_kind: str = "bm25"
    """bm25 or keyword over retriever_corpus, or a name given to register_retriever (as MemActConfig's)."""
    retriever_corpus: str | None = None
    """Corpus JSONL ({id, title, text} rows) for an in-process retriever."""
    retriever_url: str | None = None
    """Base URL of a retrieval service (wins over the corpus)."""
    retriever_scope: str = valid("corpus", choices=("corpus", "task"))
    """"corpus": one retriever for every task; "task": BM25 over `task.meta["documents"]` (the CPU task)."""
    system_template: str | None = None
    """System prompt text (no placeholders); None = the workflow's packaged one."""
    system_template_file: str | None = None
    """File holding the system prompt."""
    user_template: str | None = None
    """User prompt; needs {question} and {answer_format}. None = the packaged memact_user."""
    user_template_file: str | None = None
    answer_instruction: str | None = None
    """Text put in {answer_format} (None = memrl.rewards.multiq.answer_format(task))."""
    tool_parser: str = valid("memrl", choices=tc.PARSERS)
    """How a <tool_call> block is read (memrl.tools.calls, as MemActConfig.tool_parser)."""
    tool_call_format: str = valid("auto", choices=("auto", *tc.CALL_FORMATS))
    """How the agent writes a call (as MemActConfig.tool_call_format): "hermes" JSON, "xml"
    (<tool_call><function=NAME><parameter=ARG>value</parameter></function></tool_call>, the qwen3-coder
    templates' format; FoldAgent's Seed-OSS / Qwen3 agents write <function=...> calls), or "auto" (xml when
    the chat template writes <function=). It also picks the wording of the tools block of templates
    without tools support."""
    enable_thinking: bool | None = None
    """The chat template's thinking switch (None = the template's default; true on a template without the
    switch is refused once the tokenizer loads)."""
    require_final_answer: bool = False
    """True: the reward reads only the text after the last "FINAL_ANSWER: " (a reply without it scores 0)."""
    overlong_mask: bool = False
    """True (SUPO's overlong masking): a trajectory that stopped without an answer (turns, summaries or the
    context budget ran out) is left out of its group's advantage statistics and trains with advantage 0
    (`info["exclude_from_group"]`, which grpo, dcpo and foldgrpo honour); False: it trains with reward 0."""

    SYSTEM_DEFAULT = "search_agent_system"

    def __post_init__(self) -> None:
        if self.tool_call_format == "xml" and self.tool_parser == "published":
            raise ValueError("workflow.tool_parser=published reads Hermes JSON calls only; it cannot be used with "
                             "workflow.tool_call_format=xml")

    def sampling(self, rng: random.Random) -> SamplingParams:
        seed = rng.getrandbits(31) if self.temperature > 0 else None
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_turn_tokens, seed=seed)


def user_pieces(tok: Any, template_kw: dict[str, Any]) -> tuple[str, str]:
    """(text before, text after) a user message's content, cut from the chat template by difference: a user
    message rendered after another (not after an assistant one: a thinking template such as Qwen3's renders
    an earlier assistant turn differently once a user message follows it)."""
    base = [{"role": "user", "content": "u"}]
    before = tok.apply_chat_template(base, tokenize=False, add_generation_prompt=False, **template_kw)
    after = tok.apply_chat_template(base + [{"role": "user", "content": _USER_SENTINEL}], tokenize=False,
                                    add_generation_prompt=False, **template_kw)
    if not after.startswith(before) or after.count(_USER_SENTINEL) != 1:
        raise ctx.ChatFormatError("chat template: a second user message does not extend the rendered messages")
    pre, post = after[len(before):].split(_USER_SENTINEL, 1)
    return pre, post


def turn_spans(snapshot: list[ctx.Message], since_turn: int) -> list[list[int]]:
    """[turn, start, end] of each assistant turn's sampled ids after `since_turn`, as offsets into the response
    `thread_row` cuts from `snapshot` (before its trailing cut, which never reaches a sampled id)."""
    first = next((i for i, m in enumerate(snapshot) if m.kind == "assistant" and m.turn > since_turn), None)
    if first is None:
        return []
    out, off = [], -snapshot[first].header_len
    for m in snapshot[first:]:
        if m.kind == "assistant" and m.turn > since_turn:
            start = off + m.header_len
            out.append([m.turn, start, start + m.generated_len])
        off += len(m.ids)
    return out


def thread_row(snapshot: list[ctx.Message], since_turn: int, step: int, info: dict[str, Any]) -> Segment | None:
    """The row of the assistant turns after `since_turn` in `snapshot` (module docstring); None if none trains."""
    first = next((i for i, m in enumerate(snapshot) if m.kind == "assistant" and m.turn > since_turn), None)
    if first is None:
        return None
    lead = snapshot[first]
    prompt = ctx.context_ids(snapshot[:first]) + lead.ids[: lead.header_len]
    ids, mask, lps = [], [], []
    for m in snapshot[first:]:
        trains = m.kind == "assistant" and m.turn > since_turn
        ids += m.ids
        mask += m.mask if trains else [0] * len(m.ids)
        lps += m.logprobs if trains else [0.0] * len(m.ids)
    ids, mask, lps = ids[lead.header_len:], mask[lead.header_len:], lps[lead.header_len:]
    if 1 not in mask:
        return None
    end = len(mask) - mask[::-1].index(1)  # drop what follows the last generated token
    spans = turn_spans(snapshot, since_turn)
    return Segment(prompt_ids=prompt, response_ids=ids[:end], response_logprobs=lps[:end], loss_mask=mask[:end],
                   step=step, info={**info, "turns": [s[0] for s in spans], "turn_spans": spans})


@dataclass
class Turn:
    """One assistant turn: its message (in the thread's context), decoded text and parsed calls."""

    message: ctx.Message
    text: str
    parsed: tc.ParseResult


class AgentLoop:
    """State of one trajectory of a family member: the engine plumbing, the search tool, counters, segments."""

    extra_tools: tuple[dict[str, Any], ...] = ()
    counters: tuple[str, ...] = ()

    def __init__(self, task: Task, engine: Engine, cfg: SearchAgentConfig, rng: random.Random, services: Any) -> None:
        self.task, self.engine, self.cfg, self.rng = task, engine, cfg, rng
        self.tok = engine.tokenizer
        self.template_kw = template_kwargs(cfg.enable_thinking)
        self.fmt = ctx.ChatFormat.from_tokenizer(self.tok, self.template_kw)
        self._user_pieces: tuple[str, str] | None = None  # cut on first use (only summarize inserts user messages)
        self.call_format = cfg.tool_call_format
        if self.call_format == "auto":
            self.call_format = tc.detect_call_format(self.tok)
        self.tools = [ts.SEARCH_SCHEMA, *self.extra_tools]
        self.schemas = tc.schema_index(self.tools)
        self.retriever = (ts.task_retriever(task) if cfg.retriever_scope == "task" else
                          services.retriever(cfg.retriever_kind, cfg.retriever_corpus, cfg.retriever_url))
        self.counts = dict.fromkeys((*BASE_COUNTERS, *self.counters), 0)
        self.segments: list[Segment] = []
        self.next_id = 1
        self.turn = 0  # the next assistant turn's index, over all threads
        self.generated = 0
        self.discarded = 0
        self.context_lengths: list[int] = []
        self.turn_versions: dict[int, int] = {}
        self.header = self.encode(self.fmt.assistant_header)
        eos = getattr(self.tok, "eos_token_id", None)
        eos_text = self.tok.decode([eos]) if eos is not None else None
        self.eos = eos
        self.end_full = self.encode(self.fmt.assistant_end)
        self.end_after_eos = self.encode(self.fmt.assistant_end[len(eos_text):]) if (
            eos_text and self.fmt.assistant_end.startswith(eos_text)) else self.end_full

    # ---- plumbing ----
    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def new_id(self) -> str:
        n, self.next_id = self.next_id, self.next_id + 1
        return f"r{n}"

    def head(self) -> ctx.Message:
        """The first prompt (system + user, tools in the template or appended to the system prompt)."""
        cfg, task = self.cfg, self.task
        system = load_template(cfg.SYSTEM_DEFAULT, (), cfg.system_template_file, cfg.system_template).render()
        user = load_template("memact_user", ("question", "answer_format"), cfg.user_template_file,
                             cfg.user_template).render(
            question=task.question,
            answer_format=cfg.answer_instruction if cfg.answer_instruction is not None else answer_format(task))
        # the question and the prompts as plain text: a control token's text in them is never a control id
        text, ids = encode_rendered(self.tok, [system, user], lambda v: tc.render_system(
            self.tok, v[0], v[1], self.tools, self.template_kw, self.call_format)[0])
        return ctx.head_message(ids, text)

    def user_message(self, text: str, turn: int) -> ctx.Message:
        """A user message the workflow inserts (tokenized once, mask 0)."""
        if self._user_pieces is None:
            self._user_pieces = user_pieces(self.tok, self.template_kw)
        pre, post = self._user_pieces
        ids = encode_pieces(self.tok, [(pre, False), (text, True), (post, False)])  # the text as plain text
        return ctx.Message("user", ids, [0] * len(ids), [0.0] * len(ids), turn=turn, text=text)

    def add_tool(self, messages: list[ctx.Message], turn: int, body: str, owner: ctx.Message,
                 rid: str | None = None) -> str:
        rid = rid or self.new_id()
        body, cut = ts.truncate_middle(body, self.cfg.max_tool_response_chars, None)
        self.counts["tool_truncations"] += int(cut)
        content = f"[{rid}] {body}"
        ids = encode_pieces(self.tok, [(self.fmt.tool_prefix, False), (content, True), (self.fmt.tool_suffix, False)])
        messages.append(ctx.tool_message(ids, turn, rid, content))  # a tool result (retrieved passages): plain text
        owner.call_ids.append(rid)
        return rid

    async def step(self, messages: list[ctx.Message], tools: set[str], shared_turns: bool = True) -> Turn | None:
        """Sample the next assistant turn of the thread `messages` (appended to it); None when its prompt
        would pass the budget or the turns ran out (nothing is sampled). `shared_turns=False`: the caller
        keeps its own turn budget (a fold branch with `branch_turn_budget=own`); the turn still counts."""
        if shared_turns and self.turn >= self.cfg.max_assistant_turns:
            return None
        prompt = ctx.context_ids(messages) + self.header
        room = None
        if self.cfg.response_budget:
            limit = min(self.cfg.max_context_tokens, len(messages[0].ids) + self.cfg.response_budget)
            room = limit - len(prompt)
            if room < self.cfg.min_call_tokens:
                return None
        elif len(prompt) > self.cfg.max_context_tokens:
            return None
        sampling = self.cfg.sampling(self.rng)
        if room is not None:
            sampling = dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, room))
        self.context_lengths.append(len(prompt))
        turn = self.turn
        self.turn += 1
        out = await self.engine.generate(prompt, sampling)
        if VERSION_KEY in out.info:
            self.turn_versions[turn] = int(out.info[VERSION_KEY])
        gen = list(out.token_ids)
        self.generated += len(gen)
        text = decode_response(self.tok, gen)
        end = self.end_after_eos if gen and gen[-1] == self.eos else self.end_full
        owner = ctx.assistant_message(self.header, gen, list(out.logprobs), end, turn, text)
        messages.append(owner)
        schemas = {k: v for k, v in self.schemas.items() if k in tools}
        parsed = tc.parse_tool_calls(text, self.cfg.max_parallel_calls, self.cfg.tool_parser, self.call_format,
                                     schemas)
        self.counts["malformed_calls"] += len(parsed.errors)
        return Turn(owner, text, parsed)

    def reply_errors(self, messages: list[ctx.Message], t: Turn) -> None:
        """Error replies for the turn's malformed blocks and dropped calls (each an error turn)."""
        for err in t.parsed.errors:
            self.add_tool(messages, t.message.turn, f"Error: {err}. Write each call as "
                                                    f"{tc.call_example(self.call_format)}.", t.message)
        if t.parsed.dropped:
            self.counts["dropped_calls"] += t.parsed.dropped
            self.add_tool(messages, t.message.turn, f"Error: at most {self.cfg.max_parallel_calls} tool calls run "
                                                    f"per turn; {t.parsed.dropped} more were not run.", t.message)

    async def search(self, messages: list[ctx.Message], call: tc.ToolCall, owner: ctx.Message) -> bool:
        """Run a search call; False when its arguments were bad (an error turn)."""
        out = await ts.run_search(self.retriever, call.arguments)
        self.counts["searches"] += 1
        self.counts["topk_clamped"] += int(out.clamped)
        if out.error is not None:
            self.counts["search_errors" if out.error == "retrieval" else "bad_arguments"] += 1
        self.add_tool(messages, owner.turn, out.text, owner)
        return out.error is None or out.error == "retrieval"

    async def search_turn(self, messages: list[ctx.Message]) -> tuple[str, str] | None:
        """One turn offering search alone: (answer text, stop) when the loop ends here (the context budget
        left no room: ("", "context_budget"); a reply without calls: (its text, "answer")), else None once
        the turn's calls ran and its malformed or excess calls were answered."""
        t = await self.step(messages, {ts.SEARCH})
        if t is None:
            return "", "context_budget"
        if not t.parsed.attempted:
            return t.text, "answer"
        for c in t.parsed.calls:
            if c.name == ts.SEARCH:
                await self.search(messages, c, t.message)
            else:
                self.unknown(messages, c, t.message, [ts.SEARCH])
        self.reply_errors(messages, t)
        return None

    def unknown(self, messages: list[ctx.Message], call: tc.ToolCall, owner: ctx.Message, offered: list[str]) -> None:
        self.counts["unknown_tools"] += 1
        self.add_tool(messages, owner.turn, f"Error: unknown tool {call.name!r}; available tools: "
                                            f"{', '.join(offered)}.", owner)

    def add_segment(self, seg: Segment | None) -> None:
        if seg is None:
            return
        got = [self.turn_versions[t] for t in seg.info.get("turns", ()) if t in self.turn_versions]
        if got:
            seg.info[VERSION_KEY] = min(got)
        self.segments.append(seg)

    def drop(self, before: list[ctx.Message], after: list[ctx.Message]) -> None:
        """Count the ids a fold, summary or window shift took out of the working context."""
        kept = {id(m) for m in after}
        self.discarded += sum(len(m.ids) for m in before if id(m) not in kept)

    def trajectory(self, answer_text: str, stop: str, final_messages: list[ctx.Message],
                   extra_metrics: dict[str, float], info: dict[str, Any]) -> Trajectory:
        cfg = self.cfg
        n = len(self.context_lengths)
        if self.turn == 0 and stop == "context_budget":  # not one call made: say so, never a silent 0-token run
            log.warning("task %s: the first prompt (%d tokens) is over workflow.max_context_tokens=%d: no turn was "
                        "sampled", self.task.task_id, len(ctx.context_ids(final_messages)) + len(self.header),
                        cfg.max_context_tokens)
        marker = PUBLISHED_MARKER if cfg.require_final_answer else MARKER
        metrics = {
            "turns": float(self.turn),
            "generated_tokens": float(self.generated),
            "mean_context_tokens": sum(self.context_lengths) / n if n else 0.0,
            "peak_context_tokens": float(max(self.context_lengths, default=0)),
            "context_tokens": float(max(self.context_lengths, default=0)),
            "final_context_tokens": float(len(ctx.context_ids(final_messages))),
            "tokens_discarded": float(self.discarded),
            "stop_answer": float(stop == "answer"),
            "stop_max_turns": float(stop == "max_turns"),
            "stop_context_budget": float(stop == "context_budget"),
            "no_final_marker": float(marker not in answer_text),
            "segments": float(len(self.segments)),
            **{k: float(v) for k, v in self.counts.items()},
            **extra_metrics,
        }
        overlong = stop != "answer"
        out_info: dict[str, Any] = {
            "answer_text": answer_text, "stop": stop, "require_final_answer": cfg.require_final_answer,
            "context_budget": cfg.max_context_tokens, "overlong": overlong,
            "transcript": [{"kind": m.kind, "turn": m.turn, "id": m.result_id, "text": m.text}
                           for m in final_messages], **info}
        if overlong and cfg.overlong_mask:
            out_info["exclude_from_group"] = True
        return Trajectory(task_id=self.task.task_id, trajectory_id="", segments=self.segments,
                          final_answer=final_answer_text(answer_text, cfg.require_final_answer), metrics=metrics,
                          info=out_info)
