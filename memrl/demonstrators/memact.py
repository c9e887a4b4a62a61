"""The scripted MemAct agent for the synthetic lookup task (memrl.data.synthetic_memact): the cold start.

Played through the real memact workflow by `ScriptedEngine`, so its SFT rows are the workflow's own
segments (the same rows and masks RL trains). Each turn it reads the prompt text (the working context):

1. every sub-question whose fact it holds (a document of a kept search result, or a memory note of an
   earlier prune) -> when it holds all: `FINAL_ANSWER: {"1": " red", ...}`;
2. else, when `keep_results` search results are in the context (the budget holds no more), it prunes:
   `prune_context(memory=" Kalo color red; Mira pet owl", delete_ids=[every result id in the context])`,
   the memory holding the fact each kept result answers;
3. else it searches the next unanswered sub-question, its text as the query with topk 2:
   `search(query=" color of Kalo", topk=2)` (the fact first, another fact of the name second).

**Its imperfection (what RL can improve):** at step 2 it prunes late with probability `late_prob`: it
searches the next name instead, and that result overflows the working-context budget, so the run stops
without an answer (reward 0). Everything else (which facts the note keeps, the answer) is right, so a
3-question task succeeds with probability 1 - late_prob and a 2-question one (never needs a prune)
always. The coin is drawn from the prompt text and `seed`, so a replay gives the same trajectory.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from memrl.data.synthetic_memact import ATTRIBUTES, sub_question
from memrl.tools.calls import ToolCall, format_call
from memrl.tools.search import PRUNE, SEARCH

_QUESTION = re.compile(r"^(\d+)\. (\w+) of (\w+)\?$", re.MULTILINE)
_RESULT = re.compile(r"\[(r\d+)\] ")
_SEARCH_RESULT = re.compile(r"\[(r\d+)\] Search results for ")
_DOC = re.compile(r"^\(\d+\) ([^<\n]+)", re.MULTILINE)  # a document line, up to the chat marker that may close it
_MEMORY = re.compile(r'"memory": "([^"]*)"')


SEARCH_TOPK = 2


def search_reply(attribute: str, name: str, topk: int = SEARCH_TOPK) -> str:
    query = " " + sub_question(attribute, name).rstrip("?")
    return format_call(ToolCall(SEARCH, {"query": query, "topk": topk}))


def prune_reply(facts: list[tuple[str, str, str]], delete_ids: list[str]) -> str:
    memory = " " + "; ".join(f"{n} {a} {v}" for n, a, v in facts)
    return format_call(ToolCall(PRUNE, {"memory": memory, "delete_ids": delete_ids}))


def answer_reply(values: list[str]) -> str:
    return "FINAL_ANSWER: " + json.dumps({str(i): f" {v}" for i, v in enumerate(values, 1)})


def parse_document(text: str) -> tuple[str, str, str] | None:
    """(name, attribute, value) of a world document's text ("Kalo color red"), None if it is not one."""
    words = text.split()
    if len(words) != 3 or words[1] not in ATTRIBUTES or words[2] not in ATTRIBUTES[words[1]]:
        return None
    return words[0], words[1], words[2]


def parse_memory(note: str) -> list[tuple[str, str, str]]:
    """The (name, attribute, value) facts of a memory note "Kalo color red; Mira pet owl"."""
    out = []
    for part in note.split(";"):
        words = part.split()
        if len(words) == 3:
            out.append((words[0], words[1], words[2]))
    return out


@dataclass
class MemActDemonstrator:
    """A ScriptedEngine script for the synthetic MemAct task (module docstring)."""

    keep_results: int = 2
    """Search results the budget holds; with this many in the context it prunes before searching on."""
    late_prob: float = 0.6
    """Probability of pruning late (searching on instead, which overflows the budget)."""
    seed: int = 0
    topk: int = SEARCH_TOPK
    """Passages each search asks for: 2 = the asked fact and a distractor fact of the same name; 1 = the
    asked fact alone."""

    def __post_init__(self) -> None:
        if self.keep_results < 1:
            raise ValueError(f"MemActDemonstrator.keep_results must be >= 1, got {self.keep_results}")
        if not 0.0 <= self.late_prob <= 1.0:
            raise ValueError(f"MemActDemonstrator.late_prob must be in [0, 1], got {self.late_prob}")
        if self.topk < 1:
            raise ValueError(f"MemActDemonstrator.topk must be >= 1, got {self.topk}")

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        questions = [(a, n) for _, a, n in _QUESTION.findall(prompt_text)]
        if not questions:
            raise ValueError(f"MemActDemonstrator: no sub-questions in the prompt: {prompt_text[:200]!r}")
        known: dict[tuple[str, str], str] = {}
        for note in _MEMORY.findall(prompt_text):
            for n, a, v in parse_memory(note):
                known[(n, a)] = v
        held: dict[tuple[str, str], str] = {}  # facts the kept search results show, not yet in a note
        for doc in _DOC.findall(prompt_text):
            parsed = parse_document(doc)
            if parsed is not None:
                held[(parsed[0], parsed[1])] = parsed[2]
        missing = [(a, n) for a, n in questions if (n, a) not in known and (n, a) not in held]
        if not missing:
            return answer_reply([known.get((n, a)) or held[(n, a)] for a, n in questions])
        results = _SEARCH_RESULT.findall(prompt_text)
        if len(results) >= self.keep_results:
            late = random.Random(f"{self.seed}:{prompt_text}").random() < self.late_prob
            if not late:
                facts = [(n, a, held[(n, a)]) for a, n in questions if (n, a) in held and (n, a) not in known]
                return prune_reply(facts, _RESULT.findall(prompt_text))
        return search_reply(*missing[0], topk=self.topk)
