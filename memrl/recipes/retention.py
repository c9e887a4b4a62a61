"""Where a MemAgent memory loses the asked fact, step by step, on the synthetic task's one-fact questions.

Every memory call of a trajectory is one event, classified from the previous memory, the section read and
the new memory (facts parsed with `memrl.data.synthetic.find_facts`; the asked fact is the question's key
with the gold value):

- the section holds the asked fact: `captured` (the new memory holds it) or `missed`;
- the previous memory held it: `kept`, or lost, as
  `lost_replaced` (the new memory took the section's fact: the question-blind rewrite),
  `lost_value_from_section` / `lost_value_other` (the asked key kept, its value swapped for the section's
  value / another one), `lost_key_from_section` / `lost_key_other` (the gold value kept under the
  section's key / another key: a binding error), `lost_other` (empty or unparsable memory);
- otherwise `idle` (the fact is neither held nor read at this step).

`loss_rate` = lost / (kept + lost): the chance that one rewrite drops a held fact, which compounds over the
~n/2 rewrites after the fact in an n-chunk document. `capture_rate` = captured / (captured + missed).
`benchmarks/demo_failures.py` prints these for a demo checkpoint.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from memrl.data.synthetic import find_facts, question_key

LOST = ("lost_replaced", "lost_value_from_section", "lost_value_other", "lost_key_from_section",
        "lost_key_other", "lost_other")
EVENTS = ("captured", "missed", "kept", *LOST, "idle")


def classify_step(previous_memory: str, memory: str, section: str, key: str, answer: str,
                  sep: str | None = "is") -> str:
    """One memory call's event (see the module docstring) for the question asking `key`, gold `answer`."""
    gold = (key, answer)
    read, held, now = find_facts(section, sep), find_facts(previous_memory or "", sep), find_facts(memory or "", sep)
    if gold in read:
        return "captured" if gold in now else "missed"
    if gold not in held:
        return "idle"
    if gold in now:
        return "kept"
    if any(f in now for f in read):
        return "lost_replaced"
    section_keys, section_values = {k for k, _ in read}, {v for _, v in read}
    for k, v in now:
        if k == key:
            return "lost_value_from_section" if v in section_values else "lost_value_other"
    for k, v in now:
        if v == answer:
            return "lost_key_from_section" if k in section_keys else "lost_key_other"
    return "lost_other"


@dataclass
class RetentionCounter:
    """Counts events over finished trajectories; pass `add` as `evaluate_rows(on_trajectory=...)`.
    Bridge (two-fact) questions are skipped and counted in `skipped_tasks`."""

    sep: str | None = "is"
    events: Counter = field(default_factory=Counter)
    examples: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    """Up to `keep_examples` (previous memory, section, new memory) per lost / missed event."""
    keep_examples: int = 5
    skipped_tasks: int = 0

    def add(self, task: Any, trajectory: Any) -> None:
        key, hops = question_key(task.question)
        if hops != 1:
            self.skipped_tasks += 1
            return
        for seg in trajectory.segments:
            info = seg.info
            if info.get("kind") != "memory":
                continue
            prev, section, new = (info.get(k) or "" for k in ("previous_memory", "chunk", "memory"))
            ev = classify_step(prev, new, section, key, task.answers[0], self.sep)
            self.events[ev] += 1
            if ev in LOST or ev == "missed":
                ex = self.examples.setdefault(ev, [])
                if len(ex) < self.keep_examples:
                    ex.append((prev, section, new))

    @property
    def lost(self) -> int:
        return sum(self.events[e] for e in LOST)

    @property
    def loss_rate(self) -> float:
        n = self.lost + self.events["kept"]
        return self.lost / n if n else 0.0

    @property
    def capture_rate(self) -> float:
        n = self.events["captured"] + self.events["missed"]
        return self.events["captured"] / n if n else 0.0
