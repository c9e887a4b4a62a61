"""MemAgent's file formats (taskutils/memory_data/processing.py, different_docs_eval.py), read to `Task`
and written back losslessly.

- Training parquet rows: `data_source`, `prompt` ([{role: user, content: question}]), `context`, `ability`,
  `reward_model` {style: rule, ground_truth: [answers]}, `extra_info` {index, question, num_docs}.
  `Task.meta` holds data_source, ability, reward_style, index, num_docs, any other extra_info keys
  (written back into extra_info) and any other top-level columns under meta["columns"]. Meta values that
  parquet cannot hold as they are (nested or mixed-type lists, dicts) go into extra_info as JSON text
  under "<key>__json" and are decoded on load.
- Eval files `eval_{N}.json`: a JSON list of {context, input, answers, num_docs, index}, plus ReMemR1's
  `evidence_idx`, `min_distance`, `type`, `id` when present. Every field other than context/input/answers
  lands in `Task.meta` under its own name and is written back as a field. Index-only rows (`context` a
  list of document indices: MemAgent's sets of 12800 documents and more) are rebuilt from a `docs_from`
  dev file (memrl.data.index_only).

`meta["dataset"]`: the parquet's data_source; for eval rows a `dataset`, `data_source` or `source` field
(memrl's builder writes `source`), else the file name `eval_<dataset>_<N>.json` (ReMemR1 names its sets
eval_hotpotqa_50.json, eval_2wikimultihopqa_50.json), else the docs_from file's dataset (index-only
rows); absent when none says. Writers leave it out when another field of the row carries it.

Task ids: the row's `id` when it has one, else "{data_source}-{index}" (parquet) / "{index}" (eval json);
a Task whose id differs from that default gets an `id` field (extra_info.id in parquet) on write, so ids
survive a round trip both ways. `meta["id"]` holds a row's id only when task_id cannot reproduce it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import (
    ReadStats,
    first_record,
    parse_records,
    require,
    row_of,
    write_json,
    write_parquet,
)
from memrl.data.index_only import document_list, missing_docs_error, rebuild_context
from memrl.data.kinds import is_index_list
from memrl.data.ruler import name_label
from memrl.types import Task

EVAL_CORE = ("context", "input", "answers")
PARQUET_COLUMNS = ("data_source", "prompt", "context", "ability", "reward_model", "extra_info")
JSON_SUFFIX = "__json"
_PARQUET_META = ("data_source", "ability", "reward_style", "index", "num_docs", "columns")


def _answers(val: Any, where: str, field: str) -> list[str]:
    if isinstance(val, str):
        return [val]
    if not isinstance(val, list) or not val or not all(isinstance(a, str) for a in val):
        raise DataError(f"{where}: field '{field}' must be a non-empty list of strings, got {val!r:.80}")
    return list(val)


# --- eval_{N}.json -----------------------------------------------------------------------------------


def parse_eval_record(rec: Any, where: str, docs: Any = None) -> Task:
    """One `eval_{N}.json` row to a Task; `docs` (an index_only.DocumentList) rebuilds index-only contexts."""
    ctx = rec.get("context") if isinstance(rec, dict) else None
    if is_index_list(ctx):
        if docs is None:
            raise missing_docs_error(where.rsplit(": row", 1)[0], row_of(where))
        context = rebuild_context(ctx, docs, where)
    else:
        context = require(rec, "context", str, where)
    question = require(rec, "input", str, where)
    answers = _answers(require(rec, "answers", (list, str), where), where, "answers")
    meta = {k: v for k, v in rec.items() if k not in EVAL_CORE}
    if "id" in rec:
        tid = str(rec["id"])
        if isinstance(rec["id"], str) and rec["id"] and rec["id"] != str(rec.get("index")):
            del meta["id"]  # carried by task_id; the writer puts it back
    elif "index" in rec:
        tid = str(rec["index"])
    else:
        raise DataError(f"{where}: needs an 'index' (or 'id') field to name the question")
    if not tid:
        raise DataError(f"{where}: field 'id' is empty")
    if "dataset" not in meta:
        for k in ("data_source", "source"):
            if isinstance(meta.get(k), str) and meta[k]:
                meta["dataset"] = meta[k]
                break
        else:
            if docs is not None and is_index_list(ctx):
                meta["dataset"] = docs.dataset
    return Task(task_id=tid, question=question, context=context, answers=answers, meta=meta)


def load_eval_json(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None, docs_from: str | os.PathLike[str] | None = None,
) -> list[Task]:
    """Tasks from a MemAgent / RULER-HQA `eval_{N}.json` file (JSON list or JSONL); index-only files need
    `docs_from` (the dev file their indices point into)."""
    docs = document_list(docs_from) if docs_from else None
    first = first_record(path)
    if docs is None and isinstance(first, dict) and is_index_list(first.get("context")):
        raise missing_docs_error(str(path), 0)
    tasks = parse_records(path, lambda r, w: parse_eval_record(r, w, docs), skip_bad=skip_bad, limit=limit,
                          stats=stats)
    named, _ = name_label(path)
    if named:
        for t in tasks:
            t.meta.setdefault("dataset", named)
    return tasks


def to_eval_record(task: Task) -> dict[str, Any]:
    """A Task as an `eval_{N}.json` row: context, input, answers, num_docs, index, then the other meta."""
    rec: dict[str, Any] = {"context": task.context, "input": task.question, "answers": list(task.answers)}
    for k in ("num_docs", "index"):
        if k in task.meta:
            rec[k] = task.meta[k]
    for k, v in task.meta.items():
        if k not in rec and k not in EVAL_CORE and not (k == "dataset" and v in (task.meta.get("source"),
                                                                                task.meta.get("data_source"))):
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
        if k.endswith(JSON_SUFFIX) and isinstance(v, str):
            try:
                meta[k[: -len(JSON_SUFFIX)]] = json.loads(v)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: field 'extra_info.{k}' is not valid JSON: {e.msg}") from e
        elif k != "question":
            meta[k] = v
    default_id = f"{data_source}-{extra.get('index', where.rsplit(' ', 1)[-1])}"
    if isinstance(extra.get("id"), str) and extra["id"] and extra["id"] != default_id:
        del meta["id"]  # carried by task_id; the writer puts it back
    meta.setdefault("dataset", data_source)
    cols = {k: v for k, v in rec.items() if k not in PARQUET_COLUMNS}
    if cols:
        meta["columns"] = cols
    tid = str(extra["id"]) if extra.get("id") not in (None, "") else default_id
    return Task(task_id=tid, question=question, context=context, answers=answers, meta=meta)


def load_memagent_parquet(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a MemAgent training/validation parquet file."""
    return parse_records(path, parse_parquet_row, skip_bad=skip_bad, limit=limit, stats=stats)


def _arrow_native(v: Any) -> bool:
    """A scalar, or a list of scalars of one type: parquet stores these as they are."""
    scalar = (str, int, float, bool, type(None))
    if isinstance(v, scalar):
        return True
    if isinstance(v, list):
        kinds = {type(x) for x in v if x is not None}
        return len(kinds) <= 1 and all(isinstance(x, scalar) for x in v)
    return False


def json_meta_keys(tasks: Iterable[Task]) -> set[str]:
    """Meta keys that some task holds in a form parquet cannot store as is (decided per column)."""
    out: set[str] = set()
    kinds: dict[str, set[type]] = {}
    for t in tasks:
        for k, v in t.meta.items():
            if k in _PARQUET_META or k == "prompt" or k in out:
                continue
            if not _arrow_native(v):
                out.add(k)
                continue
            vals = v if isinstance(v, list) else [v]
            kinds.setdefault(k, set()).update(type(x) for x in vals if x is not None)
    return out | {k for k, ks in kinds.items() if len(ks - {bool}) > 1 and not ks <= {int, float}}


def to_parquet_row(
    task: Task, data_source: str = "hotpotqa", ability: str = "memory", json_keys: set[str] | None = None
) -> dict[str, Any]:
    """A Task as a MemAgent parquet row; meta keys other than the known ones go into extra_info.

    `json_keys` (default: decided from this task alone) are written as JSON text under "<key>__json".
    """
    if json_keys is None:
        json_keys = json_meta_keys([task])
    m = task.meta
    ds = m.get("data_source", data_source)
    extra: dict[str, Any] = {"index": m.get("index"), "question": task.question, "num_docs": m.get("num_docs")}
    for k, v in m.items():
        if k not in _PARQUET_META and k != "prompt" and not (k == "dataset" and v == ds):
            if k in json_keys:
                extra[k + JSON_SUFFIX] = json.dumps(v, ensure_ascii=False)
            else:
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
    tasks = list(tasks)
    keys = json_meta_keys(tasks)
    return write_parquet(path, [to_parquet_row(t, data_source, json_keys=keys) for t in tasks])
