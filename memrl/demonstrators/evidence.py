"""MemAgent's scripted reader on real multi-hop QA: the memory keeps the supporting-fact sentences a section
shows, the final reply boxes the gold answer. On RULER's synthetic tasks (needles, variable tracking) the same
reader keeps the sentences that hold a gold value (`needle_evidence`, `EvidenceDemonstrator.for_needles`).

HotpotQA and 2WikiMultihopQA name, for every question, the sentences that answer it (`supporting_facts`:
title + sentence index). A model that has never written a memory or boxed an answer (SmolLM2-135M-Instruct
boxes none of its answers zero-shot) gives GRPO no reward to learn from; a few hundred of these scripted
trajectories, played through the workflow's own prompts and trained on as an SFT cold start, give the first
signal (`memrl train-sft ... demonstrator.name=evidence`; docs/guides/real_model.md).

Prompts are read back through the workflow's templates (memrl.demonstrators.prompts), keyed by the question.
A supporting sentence split across two sections is in neither: the reader keeps only whole sentences.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memrl.demonstrators.prompts import prompt_pattern
from memrl.types import Task

log = logging.getLogger(__name__)

_SENTENCE_END = re.compile(r"\n+|(?<=[.!?])\s+")
"""Where a RULER context's sentences end: every line break (noise lines, needles, variable assignments) and
whitespace after a full stop (an essay haystack, where needles sit between its sentences)."""


def supporting_sentences(task: Task) -> list[str]:
    """The supporting-fact sentences of a HotpotQA / 2Wiki task (meta `paragraphs` + `supporting_facts`, as
    memrl.data.hotpotqa loads them), stripped, in the facts' order; facts naming a missing title or sentence
    are skipped."""
    paragraphs = {p["title"]: p["sentences"] for p in task.meta.get("paragraphs", [])}
    out: list[str] = []
    for title, sid in task.meta.get("supporting_facts", []):
        sents = paragraphs.get(title, [])
        if 0 <= int(sid) < len(sents) and sents[int(sid)].strip() and sents[int(sid)].strip() not in out:
            out.append(sents[int(sid)].strip())
    return out


def needle_evidence(task: Task) -> tuple[list[str], str]:
    """The sentences of a RULER task's context that hold a gold value (the needle with the asked key, each link
    of a variable chain), in context order, and the answer the final call boxes: the gold values joined by
    ", ". A value is matched as a whole word, so a needle holding 12345 does not count for 1234."""
    golds = [g.strip() for g in task.answers if g.strip()]
    words = [re.compile(rf"(?<![\w-]){re.escape(g)}(?![\w-])") for g in golds]
    sentences = [s.strip() for s in _SENTENCE_END.split(task.context) if s.strip()]
    kept = [s for s in sentences if any(w.search(s) for w in words)]
    return list(dict.fromkeys(kept)), ", ".join(golds)


@dataclass
class EvidenceDemonstrator:
    """Memory call: the old memory's supporting sentences plus those the section shows, one per line, in the
    facts' order (the old memory unchanged when the section shows none). Final call: `\\boxed{<first gold
    answer>}`. `evidence` maps a question to (its supporting sentences, its answer)."""

    memory_template: str
    final_template: str
    evidence: Mapping[str, tuple[list[str], str]]
    _mem: Any = field(init=False, repr=False)
    _fin: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._mem = prompt_pattern(self.memory_template, ("problem", "memory", "chunk"))
        self._fin = prompt_pattern(self.final_template, ("problem", "memory"))

    @classmethod
    def for_tasks(cls, workflow_cfg: Any, tasks: Iterable[Task], sources: Iterable[Task]) -> EvidenceDemonstrator:
        """The reader for `tasks` (any layout) in a memagent workflow config's templates, with each task's
        supporting sentences looked up by task id in `sources` (the original HotpotQA / 2Wiki records)."""
        by_id = {s.task_id: s for s in sources}
        evidence: dict[str, tuple[list[str], str]] = {}
        missing = []
        for t in tasks:
            src = by_id.get(t.task_id)
            if src is None or not src.meta.get("supporting_facts"):
                missing.append(t.task_id)
                continue
            evidence[t.question.strip()] = (supporting_sentences(src), t.answers[0])
        if missing:
            raise ValueError(f"{len(missing)} task(s) have no supporting facts in the source file (first: task id "
                             f"{missing[0]!r}): demonstrator.source must be the HotpotQA / 2Wiki file the tasks were "
                             "built from")
        mem, fin = workflow_cfg.templates()
        return cls(mem.text, fin.text, evidence)

    @classmethod
    def for_needles(cls, workflow_cfg: Any, tasks: Iterable[Task]) -> tuple[EvidenceDemonstrator, list[Task]]:
        """The reader for RULER tasks (memrl.data.ruler) in a memagent workflow config's templates, with the
        evidence read from each task's own context (`needle_evidence`), and the tasks it can play: a task whose
        question another task already asks with other evidence (the reader looks a prompt up by its question)
        or whose context holds no gold value is left out, counted in one log line."""
        evidence: dict[str, tuple[list[str], str]] = {}
        playable, clashes, empty = [], 0, 0
        for t in tasks:
            ev = needle_evidence(t)
            key = t.question.strip()
            if not ev[0]:
                empty += 1
            elif key in evidence and evidence[key] != ev:
                clashes += 1
            else:
                evidence[key] = ev
                playable.append(t)
        if clashes or empty:
            log.info("needle demonstrations: %d task(s) left out (%d ask a question another task asks with other "
                     "evidence, %d hold no gold value in their context)", clashes + empty, clashes, empty)
        mem, fin = workflow_cfg.templates()
        return cls(mem.text, fin.text, evidence), playable

    def _lookup(self, problem: str) -> tuple[list[str], str]:
        key = problem.strip()
        if key not in self.evidence:
            raise ValueError(f"EvidenceDemonstrator: no evidence for the question {key[:80]!r}")
        return self.evidence[key]

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        m = self._mem.search(prompt_text)
        if m:
            sentences, _ = self._lookup(m.group("problem"))
            memory, chunk = m.group("memory"), m.group("chunk")
            kept = [s for s in sentences if s in memory or s in chunk]
            if not [s for s in kept if s not in memory]:
                return memory
            return "\n".join(kept)
        f = self._fin.search(prompt_text)
        if f:
            _, answer = self._lookup(f.group("problem"))
            return f"\\boxed{{{answer}}}"
        raise ValueError(f"EvidenceDemonstrator: call {call_index}'s prompt matches neither the memory nor the final template")
