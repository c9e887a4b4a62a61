"""MemAct's working context: a list of messages, each holding the token ids it contributed.

Token in, token out: an assistant message holds its role header (tokenized once, mask 0), the ids the
engine sampled with their logprobs (mask 1) and the end-of-message text the template adds after them
(mask 0). A tool message is tokenized once when it is added. The working context is always the
concatenation of the kept messages' ids; pruning removes messages and never re-tokenizes anything (unless
asked to, below).

Message pieces come from the tokenizer's chat template by difference (rendered once per tokenizer):
the assistant header is render(msgs, add_generation_prompt=True) minus render(msgs); the assistant end
is what follows the content of a rendered assistant message; a tool message is the text between an
assistant message's end and the next message's content. Each tool result is rendered as if it were the
only one of its turn (templates that merge consecutive tool results into one block would otherwise leave
a half block after a deletion). Pieces are cut at marker strings, not by prefix: a thinking template
(Qwen3's) renders an assistant turn differently once a later message follows it (its empty think block
goes), and the working context keeps the ids as sampled, so only the text around the markers matters.

Pruning (`prune`): the tool messages with the given ids go, and with them the assistant messages all of
whose results went, unless they hold a `prune_context` call (that call carries the memory). An assistant
message with some results kept stays whole, the text of its deleted calls included: its ids are sampled
tokens, and cutting one call out of them would mean slicing sampled text at token boundaries that need
not exist (or re-tokenizing it). The model then sees the call without its result.

Re-encoded turns (MemActConfig.turn_tokens=reencoded, the published loop's way): an assistant turn is held
as its text encoded again through the template pieces (`reencoded_assistant`), a run of consecutive tool
messages as one rendering of the template (`tool_group_text`), and a kept turn may lose the text of calls
whose results went (`prune(cut_call_text=True)`), after which it is encoded again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

_SENTINEL = "\u2063MEMACT\u2063"
_SENTINEL_2 = "\u2063MEMACT2\u2063"


class ChatFormatError(ValueError):
    """The tokenizer's chat template cannot be split into per-message pieces."""


@dataclass(frozen=True)
class ChatFormat:
    """Per-message text pieces of one tokenizer's chat template."""

    assistant_header: str
    assistant_end: str
    tool_prefix: str
    tool_suffix: str

    @classmethod
    def from_tokenizer(cls, tok: Any, template_kwargs: dict[str, Any] | None = None) -> ChatFormat:
        """The pieces of `tok`'s template; `template_kwargs`: extra template variables (enable_thinking)."""
        kw = dict(template_kwargs or {})

        def render(msgs: list[dict[str, str]], gen: bool) -> str:
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)

        base = [{"role": "user", "content": "u"}]
        with_gen, without = render(base, True), render(base, False)
        if not with_gen.startswith(without):
            raise ChatFormatError("chat template: the generation prompt is not a suffix of the rendered messages")
        header = with_gen[len(without):]
        convo = base + [{"role": "assistant", "content": _SENTINEL}]
        full = render(convo, False)
        if not full.startswith(with_gen) or _SENTINEL not in full[len(with_gen):]:
            raise ChatFormatError("chat template: an assistant message does not follow the generation prompt")
        end = full[len(with_gen):].split(_SENTINEL, 1)[1]

        def after_assistant(role: str) -> tuple[str, str] | None:
            """(text between the assistant's end and a following `role` message's content, text after it)."""
            text = render(convo + [{"role": role, "content": _SENTINEL_2}], False)
            if text.count(_SENTINEL) != 1 or text.count(_SENTINEL_2) != 1:
                return None
            rest = text.split(_SENTINEL, 1)[1]
            if not rest.startswith(end):
                return None
            pre, post = rest[len(end):].split(_SENTINEL_2, 1)
            return pre, post

        try:
            pieces = after_assistant("tool")
        except Exception:  # noqa: BLE001 - a template without a tool role
            pieces = None
        if pieces is None:  # no tool role: a user message holding a <tool_response> block (Hermes)
            pieces = after_assistant("user")
            if pieces is None:
                raise ChatFormatError("chat template: a message after an assistant message does not follow its end")
            pieces = (pieces[0] + "<tool_response>\n", "\n</tool_response>" + pieces[1])
        return cls(header, end, *pieces)


@dataclass
class Message:
    """One piece of the working context with its ids, per-token loss mask and logprobs.

    kind: "head" (system + user), "assistant" or "tool". `turn` is the assistant turn that produced it
    (-1 for the head). `result_id` is a tool message's visible id; `call_ids` are the result ids an
    assistant message's calls produced; `has_prune` marks an assistant message holding a prune call.
    """

    kind: str
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    turn: int = -1
    header_len: int = 0
    generated_len: int = 0
    result_id: str | None = None
    call_ids: list[str] = field(default_factory=list)
    has_prune: bool = False
    text: str = ""
    content: str | None = None
    """turn_tokens=reencoded: the assistant turn's text as the published loop holds it (the sampled ids but
    the last, decoded with special tokens), encoded again into `ids`; None = `ids` are the sampled ids."""
    call_texts: dict[str, str] = field(default_factory=dict)
    """Result id -> the call that produced it, written as the published loop writes it back
    (memrl.tools.calls.published_call_text): the calls whose text a prune may cut (`prune`, cut_call_text)."""


def head_message(ids: list[int], text: str) -> Message:
    return Message("head", list(ids), [0] * len(ids), [0.0] * len(ids), text=text)


def assistant_message(
    header_ids: list[int], gen_ids: list[int], gen_logprobs: list[float], end_ids: list[int], turn: int, text: str
) -> Message:
    """Header and end are template text (mask 0, logprob 0.0); the generated ids train (mask 1)."""
    ids = list(header_ids) + list(gen_ids) + list(end_ids)
    mask = [0] * len(header_ids) + [1] * len(gen_ids) + [0] * len(end_ids)
    lps = [0.0] * len(header_ids) + [float(x) for x in gen_logprobs] + [0.0] * len(end_ids)
    return Message("assistant", ids, mask, lps, turn=turn, header_len=len(header_ids),
                   generated_len=len(gen_ids), text=text)


def reencoded_assistant(tok: Any, fmt: ChatFormat, content: str, sampled: list[int], logprobs: list[float],
                        turn: int, text: str) -> tuple[Message, int]:
    """An assistant turn as the published MemAct loop holds it (mem_agent_loop.py, MemAgentLoop.run): header +
    `content` + end encoded together, the header's id count cut from the front and the last id (ChatML: the
    newline after the end-of-turn token) dropped. Mask 1 after the header; the engine's logprob where the
    ids agree with `sampled` from the first on, 0.0 (a placeholder) from the first difference. Returns the
    message and the number of its trained ids without an engine logprob."""
    n_header = len(tok.encode(fmt.assistant_header, add_special_tokens=False))
    ids = list(tok.encode(fmt.assistant_header + content + fmt.assistant_end, add_special_tokens=False))
    header, body = ids[:n_header], ids[n_header:-1]
    same = 0
    while same < min(len(body), len(sampled)) and body[same] == sampled[same]:
        same += 1
    lps = [float(x) for x in logprobs[:same]] + [0.0] * (len(body) - same)
    msg = Message("assistant", header + body, [0] * len(header) + [1] * len(body), [0.0] * len(header) + lps,
                  turn=turn, header_len=len(header), generated_len=len(body), text=text, content=content)
    return msg, len(body) - same


def tool_group_text(tok: Any, fmt: ChatFormat, contents: list[str]) -> str:
    """The text a run of consecutive tool messages adds after an assistant turn when the chat template renders
    them together (Qwen2.5's puts them in one user turn), as the published loop renders a turn's results.
    A template without a tool role: the messages' own pieces, one after the other."""
    convo = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        before = tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=False)
        after = tok.apply_chat_template(convo + [{"role": "tool", "content": c} for c in contents], tokenize=False,
                                        add_generation_prompt=False)
        if after.startswith(before):
            return after[len(before):]
    except Exception:  # noqa: BLE001, S110 - a template without a tool role: the fallback below
        pass
    return "".join(fmt.tool_prefix + c + fmt.tool_suffix for c in contents)


def tool_message(ids: list[int], turn: int, result_id: str, text: str) -> Message:
    return Message("tool", list(ids), [0] * len(ids), [0.0] * len(ids), turn=turn, result_id=result_id, text=text)


def context_ids(messages: list[Message]) -> list[int]:
    """The working context: the kept messages' ids, concatenated."""
    return [i for m in messages for i in m.ids]


@dataclass
class PruneOutcome:
    """What a prune did: the kept messages, and the removed tool results and assistant turns."""

    messages: list[Message]
    removed_results: list[str]
    removed_turns: list[int]
    error: str | None = None
    edited_turns: list[int] = field(default_factory=list)
    """cut_call_text: the kept assistant turns whose text lost a call (their `content` is the new text;
    their ids are still the old ones, for the caller to encode again)."""


def prune(messages: list[Message], delete_ids: list[str], match: str = "exact", keep_prune_turns: bool = True,
          current_turn: int | None = None, cut_call_text: bool = False) -> PruneOutcome:
    """Remove the tool messages named in `delete_ids` and the calls left without results (module docstring).

    match="exact": each id must be a current result id; an unknown one is an error and changes nothing.
    match="substring" (the public MemAct code, mem_agent_loop.py prune_actual_messages_prompt_ids): a
    result goes when any id occurs anywhere in its text (`[rK] ...`), so "r1" also takes r10-r19 and a
    result that mentions r1; ids that match nothing are ignored, and only no match at all is an error.
    keep_prune_turns=False lets an assistant turn holding a prune call go like any other (its memory
    with it). The assistant turn `current_turn` (the one calling this prune) always stays.
    cut_call_text=True (the published loop): a kept earlier turn loses, from its `content`, the text of
    each call of `call_texts` whose result went, where the text occurs as written there; such turns are
    listed in `edited_turns`.
    """
    ids = [str(i).strip() for i in delete_ids]
    if not ids or any(not i for i in ids):
        return PruneOutcome(messages, [], [], "delete_ids must be a non-empty list of result ids")
    known = {m.result_id for m in messages if m.kind == "tool"}
    if match == "substring":
        hit = [m.result_id for m in messages if m.kind == "tool" and any(i in m.text for i in ids)]
        if not hit:
            return PruneOutcome(messages, [], [], f"no result matched {', '.join(ids)}")
        ids = [str(i) for i in hit]
    unknown = [i for i in ids if i not in known]
    if unknown:
        names = ", ".join(sorted(known - {None})) or "none"  # type: ignore[arg-type]
        return PruneOutcome(messages, [], [], f"unknown result id(s) {', '.join(unknown)}; current ids: {names}")
    gone = set(ids)
    remaining: dict[int, int] = {}  # turn -> results still kept
    for m in messages:
        if m.kind == "tool" and m.result_id not in gone:
            remaining[m.turn] = remaining.get(m.turn, 0) + 1
    kept, removed_turns = [], []
    for m in messages:
        if m.kind == "tool" and m.result_id in gone:
            continue
        deletable = keep_prune_turns is False or not m.has_prune
        if (m.kind == "assistant" and deletable and m.turn != current_turn and m.call_ids
                and not remaining.get(m.turn)):
            if set(m.call_ids) & gone:  # every result of this turn went, and some by this prune
                removed_turns.append(m.turn)
                continue
        kept.append(m)
    edited: list[int] = []
    if cut_call_text:
        for k, m in enumerate(kept):
            if m.kind != "assistant" or m.turn == current_turn or m.content is None:
                continue
            content = m.content
            for rid in m.call_ids:
                call = m.call_texts.get(rid)
                if rid in gone and call:
                    content = content.replace(call, "")
            if content != m.content:
                kept[k] = replace(m, content=content)
                edited.append(m.turn)
    return PruneOutcome(kept, [i for i in ids], removed_turns, edited_turns=edited)
