"""Prompt templates: packaged defaults, overridable from a file or a string.

Two ways to read a user's template (`template_style`):
- "memrl" (default): plain text with `{name}` placeholders, filled by literal substitution, so
  `\\boxed{}` and other braces need no escaping; any other brace is literal text.
- "str_format": a Python `str.format` string, as the published code writes its prompts (MemAgent,
  ReMemR1, vime): `{{` and `}}` are literal braces, and every `{field}` must be a known placeholder.
  A published template saved to a file renders the same bytes as the published code's `.format(...)`.

Placeholder names follow memrl; the published code's names are accepted as aliases (PLACEHOLDER_ALIASES:
`{prompt}` is memrl's `{problem}`, the question). Every placeholder a workflow declares must appear in the
template, under its name or an alias. The packaged defaults (memrl's own wording, not the published
prompts) are always "memrl" style, stored with one final newline that is not part of the prompt. A user's
template file is taken byte for byte (`strip=False`); `strip=True` drops one final newline, as memrl did
before.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from memrl.engines.base import ChatPrompt
from memrl.errors import UserError
from memrl.quiet import encode_chat, encode_text

TEMPLATE_STYLES: tuple[str, ...] = ("memrl", "str_format")
# Published placeholder name -> memrl's (MemAgent recurrent/impls/memory.py, ReMemR1
# recurrent/impls/memory_revisit.py and vime examples/mem_agent/rollout.py call the question {prompt}).
PLACEHOLDER_ALIASES: dict[str, str] = {"prompt": "problem"}


class TemplateError(UserError):
    """A template is missing a placeholder or cannot be read."""


def _spellings(name: str) -> list[str]:
    """memrl's name and the published aliases of a placeholder."""
    return [name] + [a for a, target in PLACEHOLDER_ALIASES.items() if target == name]


@dataclass(frozen=True)
class Template:
    text: str
    placeholders: tuple[str, ...]
    source: str  # where the text came from, for error messages
    style: str = "memrl"

    def __post_init__(self) -> None:
        if self.style not in TEMPLATE_STYLES:
            raise TemplateError(
                f"template {self.source}: unknown template style {self.style!r}; "
                f"expected one of {', '.join(TEMPLATE_STYLES)}"
            )
        present = self._fields() if self.style == "str_format" else None
        missing = []
        for p in self.placeholders:
            names = _spellings(p)
            found = (any(n in present for n in names) if present is not None
                     else any("{" + n + "}" in self.text for n in names))
            if not found:
                missing.append(" or ".join("{" + n + "}" for n in names))
        if missing:
            raise TemplateError(f"template {self.source} is missing placeholder(s) {', '.join(missing)}")

    def _fields(self) -> set[str]:
        """The `{field}` names of a str.format template; a one-line error for anything else."""
        known = {n for p in self.placeholders for n in _spellings(p)}
        try:
            parsed = list(string.Formatter().parse(self.text))
        except ValueError as e:
            raise TemplateError(f"template {self.source} is not a valid str.format string: {e}") from e
        fields: set[str] = set()
        for _, field, spec, conversion in parsed:
            if field is None:
                continue
            if field not in known:
                what = "a positional placeholder {}" if field == "" else "{" + field + "}"
                raise TemplateError(
                    f"template {self.source} has unknown placeholder {what}; known: "
                    f"{', '.join('{' + k + '}' for k in sorted(known))} (write {{{{ and }}}} for literal braces)"
                )
            if spec or conversion:
                raise TemplateError(
                    f"template {self.source}: placeholder {{{field}}} has a format spec or conversion; "
                    "only plain {name} placeholders are supported"
                )
            fields.add(field)
        return fields

    def render(self, **values: str) -> str:
        unknown = set(values) - set(self.placeholders)
        if unknown or set(self.placeholders) - set(values):
            raise TemplateError(
                f"template {self.source} takes {sorted(self.placeholders)}, got {sorted(values)}"
            )
        if self.style == "str_format":
            spelled = {n: values[p] for p in self.placeholders for n in _spellings(p)}
            return self.text.format(**spelled)  # str.format never re-substitutes a value's braces
        # Substitute in one pass so a value containing "{memory}" is never substituted again.
        return "".join(values[part.name] if isinstance(part, Slot) else part for part in self.parts(self.text))

    def parts(self, text: str) -> list[str | Slot]:
        """`text` (this template's text, possibly inside a chat frame) cut at its memrl-style placeholders:
        literal runs and `Slot`s (memrl's placeholder name), in order; empty runs left out."""
        keys = [("{" + n + "}", p) for p in self.placeholders for n in _spellings(p)]
        out: list[str | Slot] = []
        run: list[str] = []
        i = 0
        while i < len(text):
            for key, name in keys:
                if text.startswith(key, i):
                    if run:
                        out.append("".join(run))
                        run = []
                    out.append(Slot(name))
                    i += len(key)
                    break
            else:
                run.append(text[i])
                i += 1
        if run:
            out.append("".join(run))
        return out


@dataclass(frozen=True)
class Slot:
    """A placeholder in a template's text (`Template.parts`), by memrl's name."""

    name: str


def _strip_final_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


MAX_TEMPLATE_BYTES = 1 << 20
"""A template file is a prompt: a larger one (or a device such as /dev/zero, which never ends) is refused."""


def read_template_file(path: str | Path, strip: bool = True) -> str:
    """The text of a template file; a TemplateError naming the file when it is not a regular file of at most
    MAX_TEMPLATE_BYTES of UTF-8 text without NUL bytes (a binary file). `strip`: see `load_template`."""
    p = Path(path)
    try:
        if p.exists() and not p.is_file():
            raise TemplateError(f"template file {p} is not a regular file")
        if p.exists() and p.stat().st_size > MAX_TEMPLATE_BYTES:
            raise TemplateError(f"template file {p} holds {p.stat().st_size:,} bytes, more than a prompt's "
                                f"{MAX_TEMPLATE_BYTES:,}")
        # newline="" keeps the file's line endings as they are (no \r\n -> \n translation);
        # strip keeps memrl's former reading: universal newlines, one final newline dropped.
        with p.open(encoding="utf-8", newline=None if strip else "") as f:
            body = f.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as e:
        raise TemplateError(f"cannot read template file {p}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise TemplateError(f"template file {p} is not UTF-8 text: {e.reason} at byte {e.start}") from e
    if "\x00" in body:
        raise TemplateError(f"template file {p} is binary, not text: a NUL byte at character {body.index(chr(0))}")
    return body


def load_template(
    default_name: str,
    placeholders: tuple[str, ...],
    path: str | None = None,
    text: str | None = None,
    style: str = "memrl",
    strip: bool = True,
) -> Template:
    """Template from an inline string, else a file, else the packaged default `templates/<name>.txt`.

    `style` applies to the user's template (inline or file); the packaged default is always "memrl".
    `strip` reads a template file as memrl did before (line endings as \n, one final newline dropped);
    False keeps the file's text exactly.
    """
    if text is not None:
        return Template(text, placeholders, "(inline)", style)
    if path is not None:
        body = read_template_file(path, strip)
        return Template(_strip_final_newline(body) if strip else body, placeholders, str(path), style)
    body = resources.files("memrl").joinpath("templates", f"{default_name}.txt").read_text(encoding="utf-8")
    return Template(_strip_final_newline(body), placeholders, f"memrl/templates/{default_name}.txt")


def template_kwargs(enable_thinking: bool | None) -> dict[str, bool]:
    """The extra chat-template variables of a workflow's `enable_thinking` setting: none for None (the
    template's own default), else {"enable_thinking": value} (Qwen3's switch; other templates ignore it)."""
    return {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}


def check_thinking_switch(tokenizer: object, enable_thinking: bool | None, model: str = "the model") -> None:
    """`enable_thinking=true` on a chat template that never reads `enable_thinking` would do nothing: refused
    (a TemplateError naming the setting and the model) once the tokenizer is loaded, before any generation. A
    tokenizer without a chat template of its own (a test double, a server that renders it) is not checked."""
    template = getattr(tokenizer, "chat_template", None)
    if not enable_thinking or not template:
        return
    text = template if isinstance(template, str) else " ".join(map(str, dict(template).values()))
    if "enable_thinking" not in text:
        raise TemplateError(f"workflow.enable_thinking=true: the chat template of {model} has no thinking switch "
                            "(it never reads enable_thinking), so the setting would do nothing; drop it or use a "
                            "model whose template has one (Qwen3)")


_MESSAGE = "\x00memrl-message\x00"  # stands for the user message while the chat frame is rendered


def spliced_chat_prompt(tokenizer, template: Template, enable_thinking: bool | None = None,
                        **values: str | list[int]) -> ChatPrompt:
    """A single-turn chat prompt built by token splicing, as MemAgent's and ReMemR1's synchronous trainers
    build theirs (recurrent/utils.py TokenTemplate, around the chat frame of utils.py chat_template): the
    chat frame rendered around the template's text, that text cut at its placeholders, every literal
    piece (the frame's head and tail glued to the template's first and last) encoded on its own without
    special tokens, and between them each value: a list of ids spliced as it is, a string encoded on its
    own as plain text (memrl.quiet.encode_text: a control token's text in it is never a control id). The ids differ from encoding the rendered text at once wherever a token would straddle a piece
    boundary, or a value's ids are not what its decoded text encodes to. memrl-style templates only.
    `enable_thinking` renders the frame with template_kwargs (as chat_prompt does), so a thinking
    template's generation prompt (Qwen3's empty think block under false) is the tail piece. The messages
    (for chat-API engines) carry the rendered text, id values decoded, and the template variables."""
    if template.style != "memrl":
        raise TemplateError(f"template {template.source}: token splicing reads memrl-style templates "
                            f"(literal {{name}} placeholders), got style {template.style!r}")
    kw = template_kwargs(enable_thinking)
    frame = tokenizer.apply_chat_template([{"role": "user", "content": _MESSAGE}], tokenize=False,
                                          add_generation_prompt=True, **kw)
    if frame.count(_MESSAGE) != 1:
        raise TemplateError(f"the chat template of {type(tokenizer).__name__} does not show a user message "
                            "verbatim once; token splicing needs it to")
    text = template.render(**{k: v if isinstance(v, str) else tokenizer.decode(v) for k, v in values.items()})
    head, tail = frame.split(_MESSAGE)
    ids: list[int] = []
    for part in template.parts(head + template.text + tail):
        if isinstance(part, Slot):
            value = values[part.name]  # user text (a question, a chunk, a memory): plain text, no control ids
            ids += encode_text(tokenizer, value) if isinstance(value, str) else list(value)
        else:
            ids += tokenizer.encode(part, add_special_tokens=False)
    return ChatPrompt(ids, [{"role": "user", "content": text}], kw)


def chat_prompt(tokenizer, user_text: str, enable_thinking: bool | None = None) -> tuple[str, list[int]]:
    """One single-turn user message through the tokenizer's chat template: (text, token ids). The ids
    carry the message and the template variables (memrl.engines.base.ChatPrompt) for engines that speak
    the chat API. The message is plain text: a control token's text in it (a question's or a document's
    `<|im_end|>`) is encoded as its characters, never as the control id (memrl.quiet.encode_chat)."""
    messages = [{"role": "user", "content": user_text}]
    kw = template_kwargs(enable_thinking)
    text, ids = encode_chat(tokenizer, messages, lambda msgs: tokenizer.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True, **kw))
    return text, ChatPrompt(ids, messages, kw)
