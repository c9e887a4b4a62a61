"""Cold-start data in conversation form: rows of `messages` (+ `tools`), trained as MemAct's published SFT does.

A row is one chat: `messages` = [{role, content, tool_calls?}, ...] (system first, then user, assistant and
tool messages), `tools` = the OpenAI-style tool schemas the chat template renders (optional), and an
optional `enable_thinking` flag passed to the template. Each row becomes one training `Segment`, built as
MemAct's `verl/utils/dataset/multiturn_sft_dataset.py` (`MultiTurnSFTDataset.__getitem__`) builds its row:

- Tokens, message by message: each piece is the chat template's rendering of the messages up to and
  including it minus the rendering of those before it (`tools=` and `enable_thinking` passed every time),
  tokenized on its own; consecutive tool messages form one piece. An assistant piece is its generation
  prompt (the rendering with `add_generation_prompt=True` minus the one without), mask 0, then the rest
  (content, tool calls, end-of-message text), mask 1 or 0 below. System, user and tool pieces: mask 0.
- Before rendering, each tool call's arguments lose their None values (a parquet struct column gives every
  call every key), and `memory` then `delete_ids` (or `goal`) are moved to the end, in that order.
- Which assistant messages train (the prune rule): let P be the indices of assistant messages holding a
  `prune_context` call. A chat that ends with an assistant message without tool calls (the answer) trains
  the assistant messages after the last prune, P[-1] (all of them when P is empty). Any other chat (it ends
  at a prune: the context as it stood when the agent pruned) trains those after the second-to-last prune,
  P[-2] (all when P has fewer than two entries). The prune message at that index is masked too, so a chat
  trains exactly the turns since the previous prune, the closing prune call included.

The Segment: `prompt_ids` = the tokens up to the first trained assistant message's generation prompt
(included), `response_ids` = the rest with the mask above (tool output and template text 0), logprobs 0.0
(SFT reads none). `max_length` > 0 truncates the whole token sequence first (`truncation`: left keeps the
end, right keeps the start, error refuses), as the published dataset's `data.max_length` /
`data.truncation` (its cold-start scripts: 18000, left).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import iter_records
from memrl.quiet import encode_rendered
from memrl.types import Segment

PRUNE_TOOL = "prune_context"
_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Conversation:
    """One chat of a conversation file; `where` names its file and row for errors."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    enable_thinking: bool | None
    where: str


def is_conversation_file(path: str | os.PathLike[str]) -> bool:
    """Whether the first record of `path` is a chat: an object with a `messages` list."""
    for _, rec in iter_records(path):
        return isinstance(rec, dict) and isinstance(rec.get("messages"), list)
    return False


def _json_field(val: Any, where: str, field: str) -> Any:
    if isinstance(val, str):
        try:
            return json.loads(val)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: field '{field}' is not valid JSON: {e.msg}") from e
    return val


def parse_conversation(rec: Any, where: str) -> Conversation:
    """One record to a Conversation; a malformed one is a DataError naming where and the field."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object with 'messages', got {type(rec).__name__}")
    msgs = _json_field(rec.get("messages"), where, "messages")
    if not isinstance(msgs, list) or not msgs:
        raise DataError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content", ""), str | None):
            raise DataError(f"{where}: messages[{i}] must be {{role: {'|'.join(_ROLES)}, content: text}}, got {m!r:.80}")
        if m["role"] == "system" and i != 0:
            raise DataError(f"{where}: messages[{i}] is a system message; only the first message may be one")
        m = {k: v for k, v in m.items() if not (k == "tool_calls" and v is None)}
        m["content"] = m.get("content") or ""
        if "tool_calls" in m:
            m["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}: messages[{i}].tool_calls")
        out.append(m)
    if out[0]["role"] == "assistant":
        raise DataError(f"{where}: messages[0] is an assistant message; a chat opens with a system or user message")
    tools = _json_field(rec.get("tools"), where, "tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise DataError(f"{where}: field 'tools' must be a list of tool schemas (objects)")
    thinking = rec.get("enable_thinking")
    return Conversation(out, tools or None, None if thinking is None else bool(thinking), where)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """The calls with their arguments as the published dataset renders them (module docstring)."""
    if not isinstance(calls, list):
        raise DataError(f"{where}: must be a list of {{function: {{name, arguments}}}} calls")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise DataError(f"{where}[{j}]: a tool call needs function.name")
        args = _json_field(fn.get("arguments") if fn.get("arguments") is not None else {}, where, f"[{j}].arguments")
        if not isinstance(args, dict):
            raise DataError(f"{where}[{j}]: function.arguments must be an object")
        args = {k: v for k, v in args.items() if v is not None}
        if "memory" in args:
            memory, delete_ids = args.pop("memory"), args.pop("delete_ids", [])
            args["memory"], args["delete_ids"] = memory, delete_ids
        elif "goal" in args:
            args["goal"] = args.pop("goal")
        out.append({**c, "function": {**fn, "arguments": args}})
    return out


def load_conversations(path: str | os.PathLike[str], skip_bad: bool = False,
                       limit: int | None = None) -> tuple[list[Conversation], int]:
    """(chats of a conversation file, rows skipped as malformed when skip_bad)."""
    convs, skipped = [], 0
    for row, rec in iter_records(path):
        if limit is not None and len(convs) >= limit:
            break
        try:
            if isinstance(rec, DataError):
                raise rec
            convs.append(parse_conversation(rec, f"{path}: row {row}"))
        except DataError:
            if not skip_bad:
                raise
            skipped += 1
    return convs, skipped


def trained_assistant_indices(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of the assistant messages that train under the prune rule (module docstring)."""
    prunes = [i for i, m in enumerate(messages) if m["role"] == "assistant"
              and isinstance(m.get("tool_calls"), list)
              and any(c["function"]["name"] == PRUNE_TOOL for c in m["tool_calls"])]
    last = messages[-1]
    ends_with_answer = last["role"] == "assistant" and last.get("tool_calls") is None
    if ends_with_answer:
        before = prunes[-1] if prunes else 0
    else:
        before = prunes[-2] if len(prunes) > 1 else 0
    return [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > before]


def conversation_pieces(tok: Any, conv: Conversation) -> list[tuple[list[int], list[int], int]]:
    """(token ids, loss mask, index of the message it starts with) per piece, in order (module docstring)."""
    msgs, train = conv.messages, set(trained_assistant_indices(conv.messages))
    kw: dict[str, Any] = {"tools": conv.tools}
    if conv.enable_thinking is not None:
        kw["enable_thinking"] = conv.enable_thinking

    def render(k: int, gen: bool = False, ms: list[dict[str, Any]] | None = None) -> str:
        ms = msgs if ms is None else ms
        if k == 0:
            return ""
        return tok.apply_chat_template(ms[:k], tokenize=False, add_generation_prompt=gen, **kw)

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    def encode_span(lo: int, hi: int, start: str) -> list[int]:
        """The ids of render(hi)[len(start):] with the contents of msgs[lo:hi] as plain text (a row's
        `<|im_end|>` is never a control id; memrl.quiet.encode_rendered)."""
        def with_contents(values: list[Any]) -> str:
            ms = msgs[:lo] + [{**m, "content": v} for m, v in zip(msgs[lo:hi], values, strict=True)]
            return render(hi, ms=ms)[len(start):]

        return encode_rendered(tok, [m.get("content") for m in msgs[lo:hi]], with_contents)[1]

    pieces = []
    i = 0
    while i < len(msgs):
        role = msgs[i]["role"]
        end = i + 1
        if role == "tool":
            while end < len(msgs) and msgs[end]["role"] == "tool":
                end += 1
        before = render(i)
        if role == "assistant":
            with_gen = render(i, gen=True)
            header, body = encode(with_gen[len(before):]), encode_span(i, end, with_gen)
            pieces.append((header + body, [0] * len(header) + [int(i in train)] * len(body), i))
        else:
            ids = encode_span(i, end, before)
            pieces.append((ids, [0] * len(ids), i))
        i = end
    return pieces


def conversation_segment(tok: Any, conv: Conversation, max_length: int = 0, truncation: str = "left") -> Segment:
    """The training row of one chat (module docstring)."""
    if truncation not in ("left", "right", "error"):
        raise ValueError(f"truncation must be left, right or error, got {truncation!r}")
    pieces = conversation_pieces(tok, conv)
    ids = [t for p in pieces for t in p[0]]
    mask = [k for p in pieces for k in p[1]]
    if max_length and len(ids) > max_length:
        if truncation == "error":
            raise DataError(f"{conv.where}: {len(ids)} tokens, more than max_length {max_length}")
        keep = slice(len(ids) - max_length, None) if truncation == "left" else slice(0, max_length)
        ids, mask = ids[keep], mask[keep]
    if 1 not in mask:
        raise DataError(f"{conv.where}: no assistant tokens train in this chat (after truncation to {max_length})"
                        if max_length else f"{conv.where}: the chat has no assistant message to train")
    # the prompt ends where the first trained message's content starts (its generation prompt included)
    cut = mask.index(1)
    return Segment(prompt_ids=ids[:cut], response_ids=ids[cut:], response_logprobs=[0.0] * (len(ids) - cut),
                   loss_mask=mask[cut:], step=0, info={"kind": "conversation", "source": conv.where})


def conversation_segments(tok: Any, convs: list[Conversation], max_length: int = 0,
                          truncation: str = "left") -> list[Segment]:
    """One Segment per chat."""
    return [conversation_segment(tok, c, max_length, truncation) for c in convs]
