"""Prompt templates: packaged defaults, overridable from a file or a string.

A template is plain text with `{name}` placeholders, filled by literal substitution (so `\\boxed{}` and
other braces need no escaping). Every placeholder a workflow declares must appear in the template.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from memrl.errors import UserError


class TemplateError(UserError):
    """A template is missing a placeholder or cannot be read."""


@dataclass(frozen=True)
class Template:
    text: str
    placeholders: tuple[str, ...]
    source: str  # where the text came from, for error messages

    def __post_init__(self) -> None:
        missing = [p for p in self.placeholders if "{" + p + "}" not in self.text]
        if missing:
            names = ", ".join("{" + m + "}" for m in missing)
            raise TemplateError(f"template {self.source} is missing placeholder(s) {names}")

    def render(self, **values: str) -> str:
        unknown = set(values) - set(self.placeholders)
        if unknown or set(self.placeholders) - set(values):
            raise TemplateError(
                f"template {self.source} takes {sorted(self.placeholders)}, got {sorted(values)}"
            )
        # Substitute in one pass so a value containing "{memory}" is never substituted again.
        out, i, text = [], 0, self.text
        while i < len(text):
            for name in self.placeholders:
                key = "{" + name + "}"
                if text.startswith(key, i):
                    out.append(values[name])
                    i += len(key)
                    break
            else:
                out.append(text[i])
                i += 1
        return "".join(out)


def _strip_final_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def load_template(
    default_name: str, placeholders: tuple[str, ...], path: str | None = None, text: str | None = None
) -> Template:
    """Template from an inline string, else a file, else the packaged default `templates/<name>.txt`."""
    if text is not None:
        return Template(text, placeholders, "(inline)")
    if path is not None:
        p = Path(path)
        try:
            body = p.read_text(encoding="utf-8")
        except OSError as e:
            raise TemplateError(f"cannot read template file {p}: {e.strerror or e}") from e
        return Template(_strip_final_newline(body), placeholders, str(p))
    body = resources.files("memrl").joinpath("templates", f"{default_name}.txt").read_text(encoding="utf-8")
    return Template(_strip_final_newline(body), placeholders, f"memrl/templates/{default_name}.txt")


def chat_prompt(tokenizer, user_text: str) -> tuple[str, list[int]]:
    """One single-turn user message through the tokenizer's chat template: (text, token ids). The ids
    carry the message (memrl.engines.base.ChatPrompt) for engines that speak the chat API."""
    from memrl.engines.base import ChatPrompt

    messages = [{"role": "user", "content": user_text}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text, ChatPrompt(tokenizer.encode(text, add_special_tokens=False), messages)
