"""Tasks stored in memrl's own layout: JSON/JSONL rows {task_id, question, context, answers, meta}.

memrl's multi-question tasks can be stored in it too (meta holds sub_questions and sub_answers; MemAct's
published parquet layout is memrl.data.multiobjective); any tool can write it with `write_tasks`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, iter_records, parse_records, require, write_records
from memrl.types import Task

TASK_FIELDS = ("task_id", "question", "answers")


def is_task_layout(path: str | os.PathLike[str]) -> bool:
    """Whether the first record of `path` has memrl's Task fields."""
    for _, rec in iter_records(path):
        return isinstance(rec, dict) and all(k in rec for k in TASK_FIELDS)
    return False


def _parse(rec: Any, where: str) -> Task:
    meta = rec.get("meta") or {} if isinstance(rec, dict) else {}
    if not isinstance(meta, dict):
        raise DataError(f"{where}: field 'meta' must be an object, got {type(meta).__name__}")
    task = Task(
        task_id=str(require(rec, "task_id", (str, int), where)),
        question=require(rec, "question", str, where),
        context=rec.get("context") or "",
        answers=require(rec, "answers", (list, str), where),
        meta=meta,
    )
    subs = meta.get("sub_answers")
    if subs is not None and (not isinstance(subs, list) or not all(isinstance(s, list) and s for s in subs)):
        raise DataError(f"{where}: meta.sub_answers must be a list of non-empty alias lists")
    if subs is not None and len(subs) != len(task.answers):
        raise DataError(f"{where}: meta.sub_answers has {len(subs)} entries, answers has {len(task.answers)}")
    return task


def load_task_file(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None, stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a file in memrl's Task layout; a bad row names file, row and field."""
    return parse_records(path, _parse, skip_bad=skip_bad, limit=limit, stats=stats)


def write_tasks(path: str | os.PathLike[str], tasks: list[Task]) -> int:
    """Write tasks in the layout `load_task_file` reads (format from the file name)."""
    return write_records(path, [dataclasses.asdict(t) for t in tasks])
