"""RULER-HQA / MemAgent long contexts: pad each question's own paragraphs to N documents.

For question q and a document count N: q's own paragraphs (gold + its distractors) plus N - |own| paragraphs
drawn without replacement from the pool (every distinct (title, text) paragraph of the source set, minus
those sharing a title with q's own), shuffled, rendered "Document i:\\n{title}\\n{text}" (i from 1) and
joined by blank lines (MemAgent taskutils/memory_data/processing.py, different_docs_eval.py). The same questions are used at every N.

Randomness: one numpy Generator per (seed, N, question position), so a set is reproducible byte for byte
from the seed recorded in every row (`meta["seed"]`) and in `manifest.json`, and questions are independent
(building one never shifts another). Cost per question is O(pool + N): a partial permutation of the pool
indices, no per-question copies of the pool.

Recorded per row (the task id is written as ReMemR1's `id` field): `evidence_idx` (0-based positions of the supporting-fact documents in the shuffled
order; document number = position + 1) and `min_distance` (smallest gap between two evidence positions;
None with fewer than two).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memrl.data.errors import DataError
from memrl.data.files import replacing
from memrl.data.hotpotqa import gold_paragraph_indices, paragraph_text, render_document
from memrl.data.memagent_files import write_eval_json, write_memagent_parquet
from memrl.types import Task

DEFAULT_DOC_COUNTS: tuple[int, ...] = (50, 100, 200, 400, 800, 1600, 3200, 6400)
TRAIN_NUM_DOCS = 200


@dataclass
class DocPool:
    """Every distinct (title, text) paragraph of a source set, in first-seen order."""

    titles: list[str]
    texts: list[str]
    by_title: dict[str, list[int]]

    @classmethod
    def from_tasks(cls, tasks: Sequence[Task]) -> DocPool:
        titles: list[str] = []
        texts: list[str] = []
        by_title: dict[str, list[int]] = {}
        seen: set[tuple[str, str]] = set()
        for t in tasks:
            for p in _paragraphs(t):
                key = (p["title"], paragraph_text(p["sentences"]))
                if key in seen:
                    continue
                seen.add(key)
                by_title.setdefault(key[0], []).append(len(titles))
                titles.append(key[0])
                texts.append(key[1])
        return cls(titles, texts, by_title)

    def __len__(self) -> int:
        return len(self.titles)


def _paragraphs(task: Task) -> list[dict[str, Any]]:
    paras = task.meta.get("paragraphs")
    if not isinstance(paras, list):
        raise DataError(
            f"task {task.task_id}: meta['paragraphs'] is missing; long contexts are built from HotpotQA/2Wiki "
            "tasks (memrl.data.hotpotqa / twowiki loaders)"
        )
    return paras


def min_gap(positions: Sequence[int]) -> int | None:
    """Smallest difference between two sorted positions; None with fewer than two."""
    if len(positions) < 2:
        return None
    return int(min(b - a for a, b in zip(positions, positions[1:], strict=False)))


def _rng(seed: int, num_docs: int, position: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(num_docs), int(position)]))


def build_long_task(task: Task, pool: DocPool, num_docs: int, seed: int, position: int) -> Task:
    """`task` padded to `num_docs` documents from `pool`; `position` is the question's index in the set.

    With fewer slots than own paragraphs, the gold paragraphs are kept first, then distractors in order.
    """
    own = _paragraphs(task)
    gold = set(gold_paragraph_indices(task))
    order = sorted(range(len(own)), key=lambda i: (i not in gold, i))[:num_docs]
    kept = sorted(order)
    docs_t = [own[i]["title"] for i in kept]
    docs_x = [paragraph_text(own[i]["sentences"]) for i in kept]
    is_gold = [i in gold for i in kept]

    need = num_docs - len(kept)
    rng = _rng(seed, num_docs, position)
    if need > 0:
        excluded = {j for p in own for j in pool.by_title.get(p["title"], ())}
        available = len(pool) - len(excluded)
        if need > available:
            raise DataError(
                f"task {task.task_id}: {num_docs} documents need {need} pool paragraphs, but the pool has only "
                f"{available} usable ({len(pool)} distinct minus {len(excluded)} sharing its titles); "
                "use a larger source set or a smaller N"
            )
        draw = rng.choice(len(pool), size=min(len(pool), need + len(excluded)), replace=False)
        picked = [int(j) for j in draw if int(j) not in excluded][:need]
        docs_t += [pool.titles[j] for j in picked]
        docs_x += [pool.texts[j] for j in picked]
        is_gold += [False] * need
    perm = rng.permutation(len(docs_t))
    evidence = sorted(int(pos) for pos, src in enumerate(perm) if is_gold[src])
    context = "\n\n".join(
        render_document(pos + 1, docs_t[src], docs_x[src]) for pos, src in enumerate(perm.tolist())
    )
    meta: dict[str, Any] = {
        "num_docs": num_docs,
        "index": position,
        "evidence_idx": evidence,
        "min_distance": min_gap(evidence),
        "type": task.meta.get("type"),
        "source": task.meta.get("dataset"),
        "seed": seed,
    }
    if isinstance(task.meta.get("dataset"), str):
        meta["dataset"] = task.meta["dataset"]  # eval files keep it as `source`; the loader restores it
    return Task(task_id=task.task_id, question=task.question, context=context, answers=list(task.answers),
                meta=meta)


def select_questions(tasks: Sequence[Task], num_questions: int, seed: int) -> list[Task]:
    """`num_questions` tasks drawn with `seed`, kept in source order; all of them when 0 or more than exist."""
    if num_questions <= 0 or num_questions >= len(tasks):
        return list(tasks)
    idx = sorted(random.Random(seed).sample(range(len(tasks)), num_questions))
    return [tasks[i] for i in idx]


def iter_long_tasks(questions: Sequence[Task], pool: DocPool, num_docs: int, seed: int) -> Iterator[Task]:
    """The built tasks for one N, one at a time (a 6400-doc set never sits in memory whole)."""
    for pos, q in enumerate(questions):
        yield build_long_task(q, pool, num_docs, seed, pos)


@dataclass
class BuildManifest:
    """What `build_eval_sets` made, written as manifest.json beside the eval files."""

    source: list[str]
    seed: int
    num_questions: int
    doc_counts: list[int]
    pool_size: int
    question_ids: list[str]
    files: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def build_eval_sets(
    tasks: Sequence[Task],
    out_dir: str | os.PathLike[str],
    doc_counts: Sequence[int] = DEFAULT_DOC_COUNTS,
    num_questions: int = 128,
    seed: int = 42,
    source: Sequence[str] = (),
    pool_tasks: Sequence[Task] | None = None,
    on_file: Callable[[int, str, float], None] | None = None,
) -> BuildManifest:
    """Write `eval_{N}.json` for every N in doc_counts (same questions at each) plus manifest.json.

    The pool is every paragraph of `pool_tasks` (default: all of `tasks`, not only the selected ones).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    questions = select_questions(tasks, num_questions, seed)
    pool = DocPool.from_tasks(pool_tasks if pool_tasks is not None else tasks)
    man = BuildManifest(list(map(str, source)), seed, len(questions), [int(n) for n in doc_counts], len(pool),
                        [q.task_id for q in questions])
    for n in doc_counts:
        t0 = time.perf_counter()
        path = out / f"eval_{n}.json"
        write_eval_json(path, iter_long_tasks(questions, pool, int(n), seed))
        dt = time.perf_counter() - t0
        man.files[str(n)] = path.name
        man.seconds[str(n)] = round(dt, 3)
        if on_file is not None:
            on_file(int(n), str(path), dt)
    with replacing(out / "manifest.json") as tmp:
        tmp.write_text(json.dumps(asdict(man), indent=1) + "\n", encoding="utf-8")
    return man


def build_train_set(
    tasks: Sequence[Task],
    out_path: str | os.PathLike[str],
    num_docs: int = TRAIN_NUM_DOCS,
    seed: int = 42,
    num_questions: int = 0,
    data_source: str = "hotpotqa",
) -> int:
    """MemAgent training parquet: each question padded to `num_docs` documents (published: 200)."""
    questions = select_questions(tasks, num_questions, seed)
    pool = DocPool.from_tasks(tasks)
    return write_memagent_parquet(out_path, iter_long_tasks(questions, pool, num_docs, seed), data_source)
