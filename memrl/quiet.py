"""Library output that memrl knows to be noise, turned off only where memrl knows better.

- `hf_progress_off()`: transformers' "Loading weights" / "Writing model shards" bars (and huggingface_hub's
  bars) around memrl's own loads and saves of model directories: a bar per load of a 3 MB model is
  noise in every log. Only the bars: transformers' warnings and errors still print.
- `encode_document()`: a whole document's ids without transformers' "Token indices sequence length is
  longer than the specified maximum" warning: memrl encodes whole documents on purpose and cuts them
  into chunks (or centre-truncates them) before any of them reaches the model.
- `encode_text()` / `encode_pieces()` / `encode_chat()`: user text (questions, documents, tool results, retrieved
  passages, dataset rows) encoded as plain text. A tokenizer's plain `encode` turns a special token's text met
  anywhere in its input (`<|im_end|>`, `<|im_start|>`) into that control id, so a question or a document could
  close its own turn and forge others (prompt injection). These encode the chat template's own markers as
  control ids and every user text as the characters it is made of (transformers' split_special_tokens); a
  prompt whose user text holds no special token's text is encoded exactly as before, at once.
- `peft_rename_warning_off()`: transformers' FutureWarning that `is_gradient_checkpointing` is renamed,
  which peft triggers by reading the old name when it wraps or saves a model (not memrl's call to change).

The progress switch is process-wide in transformers (a module flag), so the context manager restores the
state it found (nesting works); another thread loading a model at the same moment also gets no bar.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from memrl.errors import UserError

try:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as tf_logging
except ImportError:  # transformers or huggingface_hub without these switches: nothing to silence
    tf_logging = None
try:
    from transformers import PreTrainedTokenizerBase
except ImportError:  # pragma: no cover - transformers is a dependency
    PreTrainedTokenizerBase = ()


@contextlib.contextmanager
def hf_progress_off() -> Iterator[None]:
    """No transformers / huggingface_hub progress bars inside the block; the previous state after it."""
    if tf_logging is None:  # transformers or huggingface_hub without these switches: nothing to silence
        yield
        return
    tf_on = tf_logging.is_progress_bar_enabled()
    hub_on = not are_progress_bars_disabled()
    tf_logging.disable_progress_bar()  # transformers' own bars; also turns huggingface_hub's off
    disable_progress_bars()
    try:
        yield
    finally:
        if tf_on:
            tf_logging.enable_progress_bar()  # also turns huggingface_hub's bars back on
        if hub_on:
            enable_progress_bars()
        else:
            disable_progress_bars()


def encode_document(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a whole document as plain text (`encode_text`), which may be longer than the tokenizer's
    model_max_length: the caller chunks or truncates it, so transformers' warning about it is not shown.

    A transformers tokenizer is asked with verbose=False (that call only: the warning stays on for every
    other encode); any other tokenizer (the test doubles' character tokenizer) is called plainly."""
    return encode_text(tokenizer, text)


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts `tokenizer.encode` turns into control ids wherever it meets them: its special tokens and the
    added tokens marked special (ChatML's <|im_start|> is one of those, not always in all_special_tokens).
    None for a tokenizer that is not a transformers one (the test doubles parse nothing)."""
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        return ()
    found = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            found.add(str(added.content))
    return tuple(sorted(t for t in found if t))


def holds_special(tokenizer: Any, texts: Any) -> bool:
    """Whether any of `texts` (strings; other values are skipped) holds a special token's text."""
    specials = special_texts(tokenizer)
    return bool(specials) and any(isinstance(t, str) and any(s in t for s in specials) for t in texts)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of user text as plain text, without special tokens added: a special token's text in it
    (`<|im_end|>`) becomes the ids of its characters, never the control id. A transformers tokenizer is asked
    with split_special_tokens=True and verbose=False (long documents are cut by the caller); any other
    tokenizer (the test doubles') is called plainly."""
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True, verbose=False))
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_pieces(tokenizer: Any, pieces: list[tuple[str, bool]]) -> list[int]:
    """Token ids of a prompt given as (text, is_user_text) pieces in order: the template's own pieces keep their
    special tokens as control ids, user pieces are plain text (`encode_text`). When no user piece holds a special
    token's text, the joined text is encoded at once, so the ids are exactly a plain encode's (a token never
    straddles what was a piece boundary); otherwise each piece is encoded on its own."""
    if not holds_special(tokenizer, [t for t, user in pieces if user]):
        return list(tokenizer.encode("".join(t for t, _ in pieces), add_special_tokens=False))
    ids: list[int] = []
    for text, user in pieces:
        if text:
            ids += encode_text(tokenizer, text) if user else list(tokenizer.encode(text, add_special_tokens=False))
    return ids


_TEXT_MARK = "\x00memrl-user-text-{}\x00"  # stands for one message's content while the chat frame is rendered
_MARK = re.compile("\x00memrl-user-text-(\\d+)\x00")


class ChatTextError(UserError):
    """A chat template rewrites a message's text that holds a special token's text, so its pieces cannot be told
    from the template's own (the message cannot be kept plain text)."""


def text_pieces(tokenizer: Any, values: list[Any], render: Callable[[list[Any]], str],
                text: str | None = None) -> list[tuple[str, bool]]:
    """`render(values)` (a prompt's text built from the user texts `values`: message contents, a system and a
    user prompt) cut into (text, is_user_text) pieces: every string of `values` is user text, the rest is the
    template's. [(text, False)] when no value holds a special token's text (nothing to keep apart). `text`:
    render(values), when the caller has it already. It renders once more with a marker for each string value,
    so a user text is found where the template put it, never where its words happen to recur. ChatTextError
    when the rendering does not show each value verbatim (the template rewrites it)."""
    text = render(values) if text is None else text
    if not holds_special(tokenizer, values):
        return [(text, False)]
    framed = render([_TEXT_MARK.format(i) if isinstance(v, str) else v for i, v in enumerate(values)])
    pieces: list[tuple[str, bool]] = []
    at = 0
    for m in _MARK.finditer(framed):
        pieces.append((framed[at:m.start()], False))
        pieces.append((str(values[int(m.group(1))]), True))
        at = m.end()
    pieces.append((framed[at:], False))
    if "".join(t for t, _ in pieces) != text:
        raise ChatTextError("the chat template rewrites a message's text, and that text holds a special token's "
                            "text (such as <|im_end|>); memrl cannot keep it plain text: remove the control "
                            "token's text from the input")
    return [(t, user) for t, user in pieces if t]


def chat_pieces(tokenizer: Any, messages: list[dict[str, Any]], render: Callable[[list[dict[str, Any]]], str],
                text: str | None = None) -> list[tuple[str, bool]]:
    """text_pieces over the messages' contents: `render(messages)` cut into the template's pieces and the
    messages' contents (user text)."""
    return text_pieces(tokenizer, [m.get("content") for m in messages],
                       lambda vals: render([{**m, "content": v} for m, v in zip(messages, vals, strict=True)]), text)


def encode_rendered(tokenizer: Any, values: list[Any], render: Callable[[list[Any]], str]) -> tuple[str, list[int]]:
    """(render(values), its token ids) with every string of `values` as plain text (text_pieces, encode_pieces)."""
    text = render(values)
    return text, encode_pieces(tokenizer, text_pieces(tokenizer, values, render, text))


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]],
                render: Callable[[list[dict[str, Any]]], str]) -> tuple[str, list[int]]:
    """(render(messages), its token ids) with the template's markers as control ids and every message's content
    as plain text (chat_pieces, encode_pieces): the ids of a plain encode when no content holds a special
    token's text."""
    text = render(messages)
    return text, encode_pieces(tokenizer, chat_pieces(tokenizer, messages, render, text))


@contextlib.contextmanager
def peft_rename_warning_off() -> Iterator[None]:
    """Inside the block, no FutureWarning that transformers' `is_gradient_checkpointing` is renamed (peft
    reads the old name); every other warning as usual."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        yield
