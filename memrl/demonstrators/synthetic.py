"""Demonstrators for the synthetic fact-retrieval task (memrl.data.synthetic): the question-blind
cold-start rule and the optimal one-hop policy, as ScriptedEngine scripts (prompt text in, reply out)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from memrl.data.synthetic import VALUES, asked_key, find_facts, memory_text
from memrl.demonstrators.prompts import prompt_pattern


@dataclass
class RecentFactsDemonstrator:
    """MemAgent demonstrations that teach the FORMAT, not the strategy.

    Memory step: keep the `budget` most recent facts of (old memory + this section), regardless of the
    question; with probability `skip_prob` ignore the section's facts and keep the old memory (so the
    demonstrated policy is stochastic and question-blind). Final step: `\\boxed{value}` of the memory
    fact that answers the question (following a bridge link when both facts are there), else
    `\\boxed{unanswerable_text}` (or, when that is None, the value of the last fact in memory: a blind
    guess). Reading the answer from memory is part of the format; what to keep is not. Call it as a
    `memrl.demonstrators.ScriptedEngine` script.
    """

    memory_template: str
    final_template: str
    budget: int = 1
    skip_prob: float = 0.25
    no_memory_text: str = "No previous memory"
    seed: int = 0
    unanswerable_text: str | None = None
    """Boxed when no memory fact answers the question (e.g. "unknown"); None guesses the last fact's value."""
    fact_sep: str | None = "is"
    """The task's `SyntheticConfig.fact_sep`."""
    restate_key: bool = False
    """Open every memory with the question's key ("- Linka : Kalo is red"): the memory says what it is
    looking for. Format only: which fact is kept stays question-blind."""
    restate_sep: str | None = ":"
    """Word between the restated key and the facts (None or "" = none: "- Linka Kalo is red")."""

    def __post_init__(self) -> None:
        if self.restate_key and not self.fact_sep:
            raise ValueError("RecentFactsDemonstrator.restate_key needs a fact separator (fact_sep), e.g. 'is'")
        self._mem = prompt_pattern(self.memory_template, ("problem", "memory", "chunk"))
        self._fin = prompt_pattern(self.final_template, ("problem", "memory"))
        self._rng = random.Random(f"rule:{self.seed}")

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        m = self._mem.search(prompt_text)
        if m and "chunk" in m.groupdict():
            old = find_facts(m.group("memory"), self.fact_sep)
            new = find_facts(m.group("chunk"), self.fact_sep)
            facts = old if (new and self._rng.random() < self.skip_prob) else (old + new)[-self.budget :]
            return self._memory(facts, m.group("problem"))
        f = self._fin.search(prompt_text)
        if not f:
            raise ValueError(f"RecentFactsDemonstrator: prompt matches neither template: {prompt_text[:200]!r}")
        facts = find_facts(f.group("memory"), self.fact_sep)
        key, hops = asked_key(f.group("problem"))
        table = dict(facts)
        answer = table.get(key)
        if answer is not None and hops == 2:
            answer = table.get(answer)
        if answer is None and self.unanswerable_text is not None:
            answer = self.unanswerable_text
        if answer is None:
            answer = facts[-1][1] if facts else VALUES[0]
        # "{ red}" keeps the value the same token (" red") as in the document; the box strips spaces.
        return f"\\boxed{{ {answer}}}"

    def _memory(self, facts: list[tuple[str, str]], problem: str) -> str:
        if not facts:
            return self.no_memory_text
        topic = asked_key(problem)[0] if self.restate_key else None
        return memory_text(facts, self.fact_sep, topic, self.restate_sep)


@dataclass
class QuestionAwareDemonstrator(RecentFactsDemonstrator):
    """The optimal one-hop policy, as a reference (never the cold start): a memory step keeps the fact
    whose key is the question's (from the section, else from the memory), else the newest fact; the
    final step answers like `RecentFactsDemonstrator`. SFT on its traces measures what a model can represent
    (benchmarks/demo_ceiling.py)."""

    keep_distractors: bool = True
    """With no fact about the question's key in the section or the memory: keep the newest fact (True) or
    leave the memory empty (False, `no_memory_text`). Both are optimal for one-hop questions; an empty memory
    gives a model no other fact to confuse with the one it must capture."""

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        m = self._mem.search(prompt_text)
        if not (m and "chunk" in m.groupdict()):
            return super().__call__(prompt_text, call_index)
        old, new = find_facts(m.group("memory"), self.fact_sep), find_facts(m.group("chunk"), self.fact_sep)
        facts = _relevant(old, new, m.group("problem"), self.keep_distractors)
        return self._memory(facts[-self.budget :], m.group("problem"))


def _relevant(old: list[tuple[str, str]], new: list[tuple[str, str]], problem: str,
              keep_distractors: bool = True) -> list[tuple[str, str]]:
    """The optimal one-hop choice: the section's fact about the question's key, else the memory's, else
    every fact (old + new, newest last) or, without `keep_distractors`, none."""
    key, _ = asked_key(problem)
    about = [f for f in new if f[0] == key] or [f for f in old if f[0] == key]
    return about or ((old + new) if keep_distractors else [])


@dataclass
class MixtureDemonstrator(QuestionAwareDemonstrator):
    """A demonstrator that has the right strategy but uses it unreliably: each memory step plays the
    optimal `QuestionAwareDemonstrator` with probability `p_aware` and the question-blind `RecentFactsDemonstrator`
    otherwise (one coin per memory step, from its own seeded stream); the final step answers like both.

    p_aware = 0 plays `RecentFactsDemonstrator` exactly (same rng stream, no coin drawn), 1 `QuestionAwareDemonstrator`.
    `aware_steps` / `memory_steps` count what was played.
    """

    p_aware: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.p_aware <= 1.0:
            raise ValueError(f"MixtureDemonstrator.p_aware must be in [0, 1], got {self.p_aware}")
        self._coin = random.Random(f"mixture:{self.seed}")
        self.aware_steps = 0
        self.memory_steps = 0

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        m = self._mem.search(prompt_text)
        if not (m and "chunk" in m.groupdict()):
            return RecentFactsDemonstrator.__call__(self, prompt_text, call_index)
        self.memory_steps += 1
        aware = self.p_aware >= 1.0 or (self.p_aware > 0.0 and self._coin.random() < self.p_aware)
        if aware:
            self.aware_steps += 1
            return QuestionAwareDemonstrator.__call__(self, prompt_text, call_index)
        return RecentFactsDemonstrator.__call__(self, prompt_text, call_index)
