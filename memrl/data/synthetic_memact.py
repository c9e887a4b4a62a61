"""A CPU task where a tiny MemAct agent must manage its context: multi-question lookups over per-task facts.

Every task draws its own small world: `entities_per_task` names (one-token names, memrl.data.synthetic.KEYS),
each with one value per attribute (color, pet, stone, food; one-token words). Its documents, one per fact
("Kalo color red"), are the task's own search corpus (`task.meta["documents"]`; the memact workflow with
`retriever_scope=task` searches them with BM25). A task asks 2 or 3 sub-questions ("color of Kalo?") about
distinct names, in memrl's multi-question layout (memrl.data.multiobjective), answered with one word each.
Searching a sub-question's text finds the asked fact first (both words match; "of" is a stopword); with
topk 2 the second hit is another fact of the same name (the rarer word), a distractor.

Facts are drawn per task, so nothing can be memorized: every answer must be copied from a search result or
from the agent's own memory note, and held-out tasks (another seed) are new fact sheets. Names and values
are single tokens of the tokenizer trained on `tokenizer_text()` (always after a space: the scripted agent
writes JSON strings with a leading space, `" red"`), because a tiny model trained from scratch learns to
copy one token by induction; with names of three digit tokens over one fixed 900-name world (the first
design) a 0.65M model copied neither names nor values after 1,200-1,800 SFT steps (docs/concepts/memact.md).

The workflow's `max_context_tokens` is set (the demo calibrates it with its tokenizer) so that the task
prompt plus two search turns fit and three do not: a 3-question task is answerable only by pruning the
first two results into a memory note (`prune_context`) before the third search.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from memrl.config import MAX_COUNT, check_config, valid
from memrl.data.multiobjective import combined_question
from memrl.data.synthetic import KEYS, VALUES
from memrl.data.tasks_jsonl import write_tasks
from memrl.types import Task

ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "color": VALUES[0:16],
    "pet": VALUES[16:32],
    "stone": VALUES[37:45],
    "food": VALUES[51:59],
}
"""Attribute -> its values (one-token words, disjoint across attributes)."""

SOURCE = "synthetic_memact"
FILLER = ("the", "record", "was", "kept", "in", "a", "ledger", "and", "copied", "twice", "by", "hand", "for",
          "archive", "under", "seal", "with", "notes", "on", "margin")
"""Filler words of padded documents (MemActTaskConfig.padding_words): none is a name, attribute or value."""


@dataclass
class MemActTaskConfig:
    """The per-task fact sheets and their questions."""

    num_names: int = valid(16, ge=1, le=len(KEYS))
    """Size of the name pool (the first num_names of memrl.data.synthetic.KEYS): few enough that every name
    is frequent in training."""
    entities_per_task: int = valid(6, ge=1, le="num_names")
    """Names in one task's world; its corpus has one document per (name, attribute)."""
    num_values: int = valid(8, ge=2, le=MAX_COUNT)
    """Values per attribute: the first num_values of its list (stone and food have 8)."""
    sub_questions: list[int] = valid(default_factory=lambda: [2, 3], ge=1, le=MAX_COUNT)
    """How many sub-questions a task asks, drawn uniformly from this list (each about another name)."""
    padding_words: int = valid(0, ge=0, le=2000)
    """Filler words on a second line of every document ("Kalo color red\nthe record was kept ..."), drawn
    per document from FILLER (words no question asks about): a search result then costs tokens as a real
    passage does, so an unmanaged context passes a budget that a folding or summarizing agent stays
    within (the context-management benchmark). 0 = one-line documents (the MemAct demo)."""

    def __post_init__(self) -> None:
        check_config(self, "MemActTaskConfig")  # the declared ranges (valid), also when built in code
        if not self.sub_questions:
            raise ValueError("MemActTaskConfig.sub_questions must name at least one count, got []")
        if self.entities_per_task >= 1 and any(k > self.entities_per_task for k in self.sub_questions):
            raise ValueError(f"MemActTaskConfig.sub_questions must be counts in 1..entities_per_task "
                             f"({self.entities_per_task}), got {self.sub_questions}")


@dataclass(frozen=True)
class Entity:
    """One name and its value per attribute (in ATTRIBUTES order)."""

    name: str
    facts: tuple[tuple[str, str], ...]

    def value(self, attribute: str) -> str:
        return dict(self.facts)[attribute]

    def documents(self) -> list[str]:
        """One document text per fact: "Kalo color red"."""
        return [f"{self.name} {a} {v}" for a, v in self.facts]


def names(cfg: MemActTaskConfig) -> tuple[str, ...]:
    return KEYS[: cfg.num_names]


def values(cfg: MemActTaskConfig) -> dict[str, tuple[str, ...]]:
    """Attribute -> the values tasks draw from."""
    return {a: vs[: cfg.num_values] for a, vs in ATTRIBUTES.items()}


def make_world(cfg: MemActTaskConfig, rng: random.Random) -> list[Entity]:
    """`cfg.entities_per_task` distinct names with a value per attribute, drawn from `rng`."""
    vals = values(cfg)
    return [Entity(n, tuple((a, rng.choice(vs)) for a, vs in vals.items()))
            for n in rng.sample(names(cfg), cfg.entities_per_task)]


def sub_question(attribute: str, name: str) -> str:
    return f"{attribute} of {name}?"


def make_tasks(cfg: MemActTaskConfig, num_tasks: int, seed: int, prefix: str = "mq") -> list[Task]:
    """`num_tasks` tasks, each with its own fact sheet, drawn from `seed` (ids "<prefix><seed>-<i>")."""
    rng = random.Random(f"memact-tasks:{seed}")
    attrs = list(ATTRIBUTES)
    tasks = []
    for i in range(num_tasks):
        world = make_world(cfg, rng)
        docs = [d for e in world for d in e.documents()]
        if cfg.padding_words:
            docs = [d + "\n" + " ".join(rng.choice(FILLER) for _ in range(cfg.padding_words)) for d in docs]
        rng.shuffle(docs)
        k = rng.choice(cfg.sub_questions)
        ents = rng.sample(world, k)
        asked = [rng.choice(attrs) for _ in ents]
        subs = [sub_question(a, e.name) for a, e in zip(asked, ents, strict=True)]
        answers = [e.value(a) for a, e in zip(asked, ents, strict=True)]
        tasks.append(Task(
            task_id=f"{prefix}{seed}-{i}", question=combined_question(subs), context="", answers=answers,
            meta={"sub_questions": subs, "sub_answers": [[a] for a in answers], "source": SOURCE,
                  "entities": [e.name for e in ents], "attributes": asked, "documents": docs, "index": i},
        ))
    return tasks


@dataclass
class MemActSplits:
    """The task splits a MemAct run makes (each task carries its own fact sheet in meta["documents"]); the
    RL split is on disk only (`write_splits`)."""

    sft_tasks: list[Task]
    eval_tasks: list[Task]


def write_splits(cfg: MemActTaskConfig, data_dir: str | Path, sft: tuple[int, int], rl: tuple[int, int],
                 heldout: tuple[int, int]) -> MemActSplits:
    """Three splits, each (number of tasks, seed): SFT tasks (kept in memory), RL tasks
    (data_dir/train_tasks.jsonl), held-out tasks (data_dir/heldout_tasks.jsonl); with three seeds no fact
    sheet is shared."""
    data_dir = Path(data_dir)
    sft_tasks = make_tasks(cfg, sft[0], sft[1], prefix="sft")
    write_tasks(data_dir / "train_tasks.jsonl", make_tasks(cfg, rl[0], rl[1], "rl"))
    eval_tasks = make_tasks(cfg, heldout[0], heldout[1], prefix="heldout")
    write_tasks(data_dir / "heldout_tasks.jsonl", eval_tasks)
    return MemActSplits(sft_tasks, eval_tasks)


def tokenizer_text(cfg: MemActTaskConfig, extra: tuple[str, ...] = (), repeats: int = 30) -> str:
    """Text to train the tiny model's tokenizer on: every name, attribute and value word with a leading space
    and at line starts, many times (so BPE makes each one token), plus `extra`."""
    words = list(names(cfg)) + list(ATTRIBUTES) + [v for vs in values(cfg).values() for v in vs] + ["of"]
    parts = list(extra)
    for _ in range(repeats):
        parts.append(" " + " ".join(words))
        parts.append("\n".join(words))
        parts.append(" ".join(f'" {n}"' for n in words))
    return "\n".join(parts)
