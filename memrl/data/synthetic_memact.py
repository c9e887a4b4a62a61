"""A CPU task where a tiny MemAct agent must manage its context: multi-question lookups over a fact world.

A world is `num_entities` names (three-digit numbers), each with one value per attribute. Its corpus has one document
per fact, "417 age 38", so a name has four documents and an attribute word is in a quarter of all.

A task asks 2 or 3 sub-questions ("age of 417?") about distinct names, in memrl's multi-question layout
(memrl.data.multiobjective), answered with one value each. Searching a sub-question's text with topk 2
(BM25, memrl.services.retrieval; "of" is a stopword) finds the asked fact first (both words match) and
another fact of the same name second (the rarer word matches): a distractor, and every result has the
same size.

The workflow's `max_context_tokens` is set (the demo calibrates it with its tokenizer) so that the task
prompt plus two search turns fit and three do not: a 3-question task is answerable only by pruning the first two
results into a memory note (`prune_context`) before the third search.

Held-out evaluation uses a second world (same names, facts drawn again from another seed), so
facts memorized during training do not help. Every attribute is one token of a tokenizer trained on
`tokenizer_text()` (words always appear after a space: the demonstrator writes JSON strings with a
leading space, `" 38"`, as the MemAgent demo writes `\\boxed{ red}`); a name is three digit tokens and a
value two.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from memrl.data.multiobjective import combined_question
from memrl.services.base import Document
from memrl.types import Task

_NUMBERS = tuple(str(i) for i in range(10, 100))
ATTRIBUTES: dict[str, tuple[str, ...]] = {"age": _NUMBERS, "room": _NUMBERS, "floor": _NUMBERS, "code": _NUMBERS}
"""Attribute -> its values: two-digit numbers. Digits are the tokens a tiny model learns to copy soonest
(with word values, e.g. colors, it had learned to copy names but not values after 1800 SFT steps)."""

SOURCE = "synthetic_memact"


@dataclass
class MemActTaskConfig:
    """The fact world and its tasks."""

    num_entities: int = 900
    """Names in a world (documents in its corpus)."""
    sub_questions: list[int] = field(default_factory=lambda: [2, 3])
    """How many sub-questions a task asks, drawn uniformly from this list (each about another name)."""
    world_seed: int = 0
    """Seed of the training world's facts (the held-out world uses `heldout_world_seed`)."""
    heldout_world_seed: int = 1
    """Seed of the held-out world: the same names with facts drawn again."""

    def __post_init__(self) -> None:
        if not 3 <= self.num_entities <= len(name_pool()):
            raise ValueError(f"MemActTaskConfig.num_entities must be in 3..{len(name_pool())}, "
                             f"got {self.num_entities}")
        if not self.sub_questions or any(not 1 <= k < self.num_entities for k in self.sub_questions):
            raise ValueError(f"MemActTaskConfig.sub_questions must be counts in 1..num_entities-1, "
                             f"got {self.sub_questions}")


@dataclass(frozen=True)
class Entity:
    """One name and its value per attribute (in ATTRIBUTES order)."""

    name: str
    facts: tuple[tuple[str, str], ...]

    def value(self, attribute: str) -> str:
        return dict(self.facts)[attribute]

    def documents(self) -> list[str]:
        """One document text per fact: "417 age 38"."""
        return [f"{self.name} {a} {v}" for a, v in self.facts]


def name_pool() -> list[str]:
    """Every name a world may use: the three-digit numbers "100".."999".

    Numbers, not made-up words: the tokenizer splits digits one by one, so a name is three tokens out of
    ten and a tiny model trained from scratch learns to copy names within its CPU budget (with 120
    single-token word names it had not after 1800 SFT steps: each name token was too rare). Many names
    (num_entities) keep each fact rare in training, so copying it from the search result is easier for
    the model than memorizing it.
    """
    return [str(i) for i in range(100, 1000)]


def make_world(cfg: MemActTaskConfig, seed: int) -> list[Entity]:
    """`cfg.num_entities` names (sorted) with facts drawn from `seed`. The names are the first of a fixed
    shuffle of the pool and depend only on num_entities, so every world has the same names."""
    pool = name_pool()
    random.Random("memact-names").shuffle(pool)
    names = sorted(pool[: cfg.num_entities])
    rng = random.Random(f"memact-world:{seed}")
    return [Entity(n, tuple((a, rng.choice(vs)) for a, vs in ATTRIBUTES.items())) for n in names]


def world_documents(world: list[Entity]) -> list[Document]:
    """The world's corpus: one document per fact ("e<name index>-<attribute index>"), no title."""
    return [Document(f"e{i}-{j}", "", text) for i, e in enumerate(world) for j, text in enumerate(e.documents())]


def write_corpus(path: str | Path, world: list[Entity]) -> Path:
    """The corpus JSONL ({"id", "title", "text"} rows) that `workflow.retriever_corpus` reads."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"id": d.id, "title": d.title, "text": d.text}) for d in world_documents(world)]
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return p


def sub_question(attribute: str, name: str) -> str:
    return f"{attribute} of {name}?"


def make_tasks(cfg: MemActTaskConfig, world: list[Entity], num_tasks: int, seed: int, prefix: str = "mq") -> list[Task]:
    """`num_tasks` tasks over `world`, drawn from `seed` (ids "<prefix><seed>-<i>")."""
    rng = random.Random(f"memact-tasks:{seed}")
    attrs = list(ATTRIBUTES)
    tasks = []
    for i in range(num_tasks):
        k = rng.choice(cfg.sub_questions)
        ents = rng.sample(world, k)
        asked = [rng.choice(attrs) for _ in ents]
        subs = [sub_question(a, e.name) for a, e in zip(asked, ents, strict=True)]
        answers = [e.value(a) for a, e in zip(asked, ents, strict=True)]
        tasks.append(Task(
            task_id=f"{prefix}{seed}-{i}", question=combined_question(subs), context="", answers=answers,
            meta={"sub_questions": subs, "sub_answers": [[a] for a in answers], "source": SOURCE,
                  "entities": [e.name for e in ents], "attributes": asked, "index": i},
        ))
    return tasks


def tokenizer_text(cfg: MemActTaskConfig, extra: tuple[str, ...] = (), repeats: int = 30) -> str:
    """Text to train the tiny model's tokenizer on: both worlds' documents and every attribute word with a
    leading space and at line starts, many times (so BPE makes each one token)."""
    words = list(ATTRIBUTES) + ["of"]
    parts = list(extra)
    for seed in (cfg.world_seed, cfg.heldout_world_seed):
        parts += [d.text for d in world_documents(make_world(cfg, seed))]
    for _ in range(repeats):
        parts.append(" " + " ".join(words))
        parts.append("\n".join(words))
        parts.append(" ".join(f'" {n}"' for n in words))
    return "\n".join(parts)
