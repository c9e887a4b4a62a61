"""Scripted agents for the context-management family on the synthetic lookup task (memrl.data.synthetic_memact):
the cold start of fold, summarize and sliding_window (and of the unmanaged search agent, sliding_window with
window_turns=0). Each reads the prompt text (the working context) as MemActDemonstrator does.

- `SearchDemonstrator`: answers when every sub-question's fact is in the context (a search result, a
  summary, a returned branch message), else searches the first missing one (topk 2: the fact and a
  distractor). Unmanaged, a 3-question task's third result overflows a budget calibrated for two; in a
  sliding window of 2 turns the first result falls out, so it searches again and again.
- `FoldDemonstrator`: in the main thread, answers when every fact came back from a branch, else opens a
  branch for the first missing one (description and prompt = the sub-question, so the scope rule finds it in
  scope); in a branch, searches the sub-question and returns the fact. **Imperfection:** with probability
  `late_prob` (per main-thread decision, drawn from the prompt text and `seed`) it searches in the main
  thread instead of branching, which leaves the result unfolded (and overflows on a 3-question task).
- `SummaryDemonstrator`: the search agent, and on the summary request a summary of every fact it holds
  ("<summary> Kalo color red; Mira pet owl</summary>"). **Imperfection:** with probability `late_prob` the
  summary keeps only the last fact found, so an earlier one must be searched again.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from memrl.data.synthetic_memact import sub_question
from memrl.demonstrators.memact import (
    _DOC,
    _QUESTION,
    answer_reply,
    parse_document,
    parse_memory,
    search_reply,
)
from memrl.tools.calls import ToolCall, format_call

_RETURNED = re.compile(r"returned: ([^<\n]*)")
_SUMMARY = re.compile(r"summarized:\n([^\n]*)")
_OPEN = re.compile(r"\] Branch ([^:\n]*): ([^\n]*?) When done, call return with what you found\.")
BRANCH_OPEN_MARK = "When done, call return with what you found."
SUMMARY_REQUEST_MARK = "Write a summary of your progress"


def _questions(prompt: str) -> list[tuple[str, str]]:
    qs = [(a, n) for _, a, n in _QUESTION.findall(prompt)]
    if not qs:
        raise ValueError(f"scripted agent: no sub-questions in the prompt: {prompt[:200]!r}")
    return qs


def _facts(text: str) -> dict[tuple[str, str], str]:
    """(name, attribute) -> value for every fact the text shows: documents, returned messages, summaries."""
    known: dict[tuple[str, str], str] = {}
    for doc in _DOC.findall(text):
        parsed = parse_document(doc)
        if parsed is not None:
            known[(parsed[0], parsed[1])] = parsed[2]
    for note in _RETURNED.findall(text) + _SUMMARY.findall(text):
        for n, a, v in parse_memory(note):
            known[(n, a)] = v
    return known


def _note(facts: list[tuple[str, str, str]]) -> str:
    return " " + "; ".join(f"{n} {a} {v}" for n, a, v in facts)


@dataclass
class SearchDemonstrator:
    """The plain search agent (module docstring)."""

    topk: int = 2

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        qs = _questions(prompt_text)
        known = _facts(prompt_text)
        missing = [(a, n) for a, n in qs if (n, a) not in known]
        if not missing:
            return answer_reply([known[(n, a)] for a, n in qs])
        return search_reply(*missing[0], topk=self.topk)


@dataclass
class FoldDemonstrator:
    """The scripted folding agent (module docstring)."""

    late_prob: float = 0.0
    seed: int = 0
    topk: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.late_prob <= 1.0:
            raise ValueError(f"FoldDemonstrator.late_prob must be in [0, 1], got {self.late_prob}")

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        qs = _questions(prompt_text)
        opened = _OPEN.findall(prompt_text)
        if opened:  # in a branch (the opening message is only in the branch's context)
            desc, task = opened[-1]
            after = prompt_text.split(BRANCH_OPEN_MARK)[-1]
            words = task.rstrip("?").split()
            attribute, name = words[0], words[-1]
            value = _facts(after).get((name, attribute))
            if value is not None:
                return format_call(ToolCall("return", {"message": _note([(name, attribute, value)])}))
            return search_reply(attribute, name, topk=self.topk)
        known = _facts(prompt_text)
        missing = [(a, n) for a, n in qs if (n, a) not in known]
        if not missing:
            return answer_reply([known[(n, a)] for a, n in qs])
        attribute, name = missing[0]
        if random.Random(f"{self.seed}:{prompt_text}").random() < self.late_prob:
            return search_reply(attribute, name, topk=self.topk)  # unfolded: the result stays in the main context
        q = sub_question(attribute, name)
        return format_call(ToolCall("branch", {"description": " " + q.rstrip("?"), "prompt": " " + q}))


@dataclass
class SummaryDemonstrator:
    """The scripted summarizing agent (module docstring)."""

    late_prob: float = 0.0
    seed: int = 0
    topk: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.late_prob <= 1.0:
            raise ValueError(f"SummaryDemonstrator.late_prob must be in [0, 1], got {self.late_prob}")

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        qs = _questions(prompt_text)
        known = _facts(prompt_text)
        tail = prompt_text[-400:]
        if SUMMARY_REQUEST_MARK in tail:
            facts = [(n, a, known[(n, a)]) for a, n in qs if (n, a) in known]
            if facts and random.Random(f"{self.seed}:{prompt_text}").random() < self.late_prob:
                facts = facts[-1:]
            return "<summary>" + _note(facts) + "</summary>"
        return SearchDemonstrator(self.topk)(prompt_text)
