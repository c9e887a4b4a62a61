"""Test doubles with exact, hand-checkable behaviour: a character tokenizer and a scripted engine.

Use them for contract tests of workflows (what prompt was sent at each step, how the reply was used);
use a real tiny model (memrl.models.tiny) for anything that must learn or batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memrl.engines.base import Completion, SamplingParams


class CharTokenizer:
    """One token per character (id = code point + 3); ids 0-2 are <pad>, <eos>, <bos>.

    The chat template wraps a user message as "<user>{content}</user><assistant>".
    """

    pad_token_id = 0
    eos_token_id = 1
    bos_token_id = 2
    OFFSET = 3

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) + self.OFFSET for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out = []
        for i in ids:
            if i < self.OFFSET:
                if not skip_special_tokens:
                    out.append(["<pad>", "<eos>", "<bos>"][i])
                continue
            out.append(chr(i - self.OFFSET))
        return "".join(out)

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False,
                            add_generation_prompt: bool = True, **_: Any) -> str | list[int]:
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        if add_generation_prompt:
            text += "<assistant>"
        return self.encode(text) if tokenize else text


@dataclass
class Call:
    """One recorded generate() call."""

    prompt_ids: list[int]
    prompt_text: str
    sampling: SamplingParams
    reply: str


@dataclass
class ScriptedEngine:
    """Answers each generate() with `script(prompt_text, call_index)` (or the next item of a list).

    The reply is tokenized with the tokenizer, truncated at max_tokens (finish "length"), else
    followed by EOS (finish "stop"). Logprobs are a fixed -0.5 per token. All calls are recorded.
    """

    script: Callable[[str, int], str] | list[str]
    tokenizer: Any = field(default_factory=CharTokenizer)
    calls: list[Call] = field(default_factory=list)
    weight_updates: int = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        await asyncio.sleep(0)  # yield, so concurrent workflows interleave as with a real engine
        prompt_text = self.tokenizer.decode(prompt_ids)
        idx = len(self.calls)
        if callable(self.script):
            reply = self.script(prompt_text, idx)
        else:
            if idx >= len(self.script):
                raise AssertionError(f"ScriptedEngine: call {idx} but only {len(self.script)} replies scripted")
            reply = self.script[idx]
        self.calls.append(Call(list(prompt_ids), prompt_text, sampling, reply))
        ids = self.tokenizer.encode(reply)
        if len(ids) >= sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        else:
            ids, finish = ids + [self.tokenizer.eos_token_id], "stop"
        return Completion(ids, [-0.5] * len(ids), finish)

    def update_weights(self, weights: Mapping[str, Any] | str) -> None:
        self.weight_updates += 1

    async def close(self) -> None:
        return None


class KeywordRetriever:
    """An in-memory Retriever: documents ranked by how many distinct query words they contain.

    Score = |words(query) & words(title + text)|, ties broken by corpus order; documents scoring 0 are
    left out. `fail_with` makes every call raise that RetrievalError (to test error handling).
    """

    def __init__(self, documents: list[Any], fail_with: str | None = None) -> None:
        self.documents = list(documents)
        self.fail_with = fail_with
        self.calls: list[tuple[list[str], int]] = []
        self._words = [_words(f"{d.title} {d.text}") for d in self.documents]

    @classmethod
    def from_jsonl(cls, path: str) -> KeywordRetriever:
        """Documents from a JSONL file of {"id", "title", "text"} rows."""
        import json

        from memrl.services.base import Document

        docs = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    docs.append(Document(str(rec["id"]), str(rec.get("title", "")), str(rec["text"])))
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}: line {lineno} is not a corpus row with id and text: {e}") from e
        return cls(docs)

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Any]]:
        from memrl.services.base import Hit, RetrievalError

        await asyncio.sleep(0)
        self.calls.append((list(queries), topk))
        if self.fail_with is not None:
            raise RetrievalError(self.fail_with)
        out = []
        for q in queries:
            qw = _words(q)
            scored = [(len(qw & w), -i) for i, w in enumerate(self._words)]
            best = sorted((s for s in scored if s[0] > 0), reverse=True)[:topk]
            out.append([Hit(self.documents[-i], float(s)) for s, i in best])
        return out

    async def close(self) -> None:
        return None


def _words(text: str) -> set[str]:
    import re

    return set(re.findall(r"[a-z0-9]+", text.lower()))
