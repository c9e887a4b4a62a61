"""MemAgent's file formats (REFERENCE.md section 5), read to `Task` and written back losslessly.

- Training parquet rows: `data_source`, `prompt` ([{role: user, content: question}]), `context`, `ability`,
  `reward_model` {style: rule, ground_truth: [answers]}, `extra_info` {index, question, num_docs}.
  `Task.meta` holds data_source, ability, reward_style, index, num_docs, any other extra_info keys
  (written back into extra_info) and any other top-level columns under meta["columns"].
- Eval files `eval_{N}.json`: a JSON list of {context, input, answers, num_docs, index}, plus ReMemR1's
  `evidence_idx`, `min_distance`, `type`, `id` when present. Every field other than context/input/answers
  lands in `Task.meta` under its own name and is written back as a field.

Task ids: the row's `id` when it has one, else "{data_source}-{index}" (parquet) / "{index}" (eval json);
a Task whose id differs from that gets an explicit `id` field on write, so ids survive a round trip.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from memrl.data.io import DataError, ReadStats, parse_records, require, write_json, write_parquet
from memrl.types import Task

EVAL_CORE = ("context", "input", "answers")
PARQUET_COLUMNS = ("data_source", "prompt", "context", "ability", "reward_model", "extra_info")
_PARQUET_META = ("data_source", "ability", "reward_style", "index", "num_docs", "columns")


def _answers(val: Any, where: str, field: str) -> list[str]:
    if isinstance(val, str):
        return [val]
    if not isinstance(val, list) or not val or not all(isinstance(a, str) for a in val):
        raise DataError(f"{where}: field '{field}' must be a non-empty list of strings, got {val!r:.80}")
    return list(val)


# --- eval_{N}.json -----------------------------------------------------------------------------------


def parse_eval_record(rec: Any, where: str) -> Task:
    """One `eval_{N}.json` row to a Task."""
    context = require(rec, "context", str, where)
    question = require(rec, "input", str, where)
    answers = _answers(require(rec, "answers", (list, str), where), where, "answers")
    meta = {k: v for k, v in rec.items() if k not in EVAL_CORE}
    if "id" in rec:
        tid = str(rec["id"])
    elif "index" in rec:
        tid = str(rec["index"])
    else:
        raise DataError(f"{where}: needs an 'index' (or 'id') field to name the question")
    if not tid:
        raise DataError(f"{where}: field 'id' is empty")
    return Task(task_id=tid, question=question, context=context, answers=answers, meta=meta)


def load_eval_json(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a MemAgent / RULER-HQA `eval_{N}.json` file (JSON list or JSONL)."""
    return parse_records(path, parse_eval_record, skip_bad=skip_bad, limit=limit, stats=stats)


def to_eval_record(task: Task) -> dict[str, Any]:
    """A Task as an `eval_{N}.json` row: context, input, answers, num_docs, index, then the other meta."""
    rec: dict[str, Any] = {"context": task.context, "input": task.question, "answers": list(task.answers)}
    for k in ("num_docs", "index"):
        if k in task.meta:
            rec[k] = task.meta[k]
    for k, v in task.meta.items():
        if k not in rec and k not in EVAL_CORE:
            rec[k] = v
    if "id" not in rec and task.task_id != str(rec.get("index")):
        rec["id"] = task.task_id
    return rec


def write_eval_json(path: str | os.PathLike[str], tasks: Iterable[Task]) -> int:
    """Write tasks as an `eval_{N}.json` list, streaming (tasks may be a generator); returns the count."""
    return write_json(path, (to_eval_record(t) for t in tasks))


# --- MemAgent training parquet --------------------------------------------------------------------------


def parse_parquet_row(rec: Any, where: str) -> Task:
    """One MemAgent parquet row to a Task."""
    data_source = require(rec, "data_source", str, where)
    prompt = require(rec, "prompt", list, where)
    if not prompt or not isinstance(prompt[-1], dict) or not isinstance(prompt[-1].get("content"), str):
        raise DataError(f"{where}: field 'prompt' must be a list of {{role, content}} messages")
    context = require(rec, "context", str, where)
    rm = require(rec, "reward_model", dict, where)
    answers = _answers(rm.get("ground_truth"), where, "reward_model.ground_truth")
    extra = rec.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' must be an object, got {type(extra).__name__}")
    question = extra.get("question") if isinstance(extra.get("question"), str) else prompt[-1]["content"]
    meta: dict[str, Any] = {"data_source": data_source, "ability": rec.get("ability"),
                            "reward_style": rm.get("style")}
    if len(prompt) != 1 or prompt[0].get("role") != "user" or prompt[0]["content"] != question:
        meta["prompt"] = prompt
    for k, v in extra.items():
        # kept even when None: pyarrow fills keys missing from some rows with null, harmless on re-write
        if k != "question":
            meta[k] = v
    cols = {k: v for k, v in rec.items() if k not in PARQUET_COLUMNS}
    if cols:
        meta["columns"] = cols
    if "id" in extra and extra["id"] is not None:
        tid = str(extra["id"])
    else:
        tid = f"{data_source}-{extra.get('index', where.rsplit(' ', 1)[-1])}"
    return Task(task_id=tid, question=question, context=context, answers=answers, meta=meta)


def load_memagent_parquet(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a MemAgent training/validation parquet file."""
    return parse_records(path, parse_parquet_row, skip_bad=skip_bad, limit=limit, stats=stats)


def to_parquet_row(task: Task, data_source: str = "hotpotqa", ability: str = "memory") -> dict[str, Any]:
    """A Task as a MemAgent parquet row; meta keys other than the known ones go into extra_info."""
    m = task.meta
    ds = m.get("data_source", data_source)
    extra: dict[str, Any] = {"index": m.get("index"), "question": task.question, "num_docs": m.get("num_docs")}
    for k, v in m.items():
        if k not in _PARQUET_META and k != "prompt":
            extra[k] = v
    if "id" not in extra and task.task_id != f"{ds}-{m.get('index')}":
        extra["id"] = task.task_id
    row: dict[str, Any] = {
        "data_source": ds,
        "prompt": m.get("prompt") or [{"role": "user", "content": task.question}],
        "context": task.context,
        "ability": m.get("ability", ability),
        "reward_model": {"style": m.get("reward_style", "rule"), "ground_truth": list(task.answers)},
        "extra_info": extra,
    }
    row.update(m.get("columns", {}))
    return row


def write_memagent_parquet(path: str | os.PathLike[str], tasks: Iterable[Task], data_source: str = "hotpotqa") -> int:
    """Write tasks as a MemAgent parquet file; returns the row count."""
    return write_parquet(path, [to_parquet_row(t, data_source) for t in tasks])


def iter_eval_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[str, list[Task]]]:
    """(path, tasks) for each eval file; parquet files read as MemAgent rows, others as eval json."""
    for p in paths:
        p = str(p)
        yield p, (load_memagent_parquet(p) if p.endswith((".parquet", ".pq")) else load_eval_json(p))
