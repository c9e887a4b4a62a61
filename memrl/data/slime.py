"""vime / slime JSONL (examples/mem_agent/prepare_data.py) to `Task`.

One row per question: `prompt` (the question; a string, or chat messages whose last `content` is the
question), `label` (the first gold answer as a string) and `metadata` {context, ground_truth: [all gold
answers], num_docs, data_source}. prepare_data.py writes this for the training split and, from MemAgent's
`eval_{N}.json`, for the RULER-HQA evaluation (`eval_{N}.jsonl`, data_source always "hotpotqa"); slime
reads it with `--input-key prompt --label-key label` and the default metadata key. `metadata` may also be
a JSON object stored as text (a parquet export).

Answers: metadata.ground_truth when present and non-empty (what vime's reward matches), else [label].
Task ids: the row number from 0, as vime's evaluator numbers rows (`_id`); the rows carry no id of their
own. `Task.meta`: dataset (= data_source), data_source, num_docs, index (= row), the other metadata keys,
and `label` only when it is not the first answer.
"""

from __future__ import annotations

import json
import os
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, parse_records, require, row_of
from memrl.types import Task

SLIME_KEYS = ("prompt", "metadata")


def _question(prompt: Any, where: str) -> str:
    if isinstance(prompt, str):
        q = prompt
    elif isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) \
            and isinstance(prompt[-1].get("content"), str):
        q = prompt[-1]["content"]
    else:
        raise DataError(f"{where}: field 'prompt' must be the question (a string) or chat messages "
                        f"[{{role, content}}], got {type(prompt).__name__}")
    if not q.strip():
        raise DataError(f"{where}: field 'prompt' is empty")
    return q


def _metadata(rec: dict[str, Any], where: str) -> dict[str, Any]:
    meta = rec.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: field 'metadata' is text but not JSON: {e.msg}") from e
    if not isinstance(meta, dict):
        raise DataError(f"{where}: field 'metadata' must be an object {{context, ground_truth, ...}}, "
                        f"got {type(meta).__name__}")
    return meta


def parse_slime_record(rec: Any, where: str) -> Task:
    """One vime / slime row to a Task."""
    question = _question(require(rec, "prompt", (str, list), where), where)
    meta_in = _metadata(rec, where)
    context = meta_in.get("context")
    if not isinstance(context, str) or not context:
        raise DataError(f"{where}: field 'metadata.context' must be the document text (a non-empty string)")
    label = rec.get("label")
    if label is not None and not isinstance(label, str):
        raise DataError(f"{where}: field 'label' must be a string, got {type(label).__name__}")
    gt = meta_in.get("ground_truth")
    if isinstance(gt, str):
        gt = [gt]
    if gt:
        if not isinstance(gt, list) or not all(isinstance(a, str) for a in gt):
            raise DataError(f"{where}: field 'metadata.ground_truth' must be a list of strings, got {gt!r:.80}")
        answers = list(gt)
    elif label:
        answers = [label]
    else:
        raise DataError(f"{where}: no gold answer: 'metadata.ground_truth' and 'label' are both missing or empty")
    row = row_of(where)
    meta: dict[str, Any] = {}
    ds = meta_in.get("data_source")
    if isinstance(ds, str) and ds:
        meta["dataset"] = ds
    for k, v in meta_in.items():
        if k not in ("context", "ground_truth"):
            meta[k] = v
    meta.setdefault("index", row)
    if label is not None and label != answers[0]:
        meta["label"] = label
    return Task(task_id=str(row), question=question, context=context, answers=answers, meta=meta)


def load_slime(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a vime / slime JSONL (or parquet) file."""
    return parse_records(path, parse_slime_record, skip_bad=skip_bad, limit=limit, stats=stats)


def to_slime_record(task: Task) -> dict[str, Any]:
    """A Task as a vime / slime row (what prepare_data.py writes, plus any other meta in metadata)."""
    md: dict[str, Any] = {"context": task.context, "ground_truth": list(task.answers)}
    for k, v in task.meta.items():
        if k not in ("dataset", "label", "index", "paragraphs"):
            md[k] = v
    md.setdefault("num_docs", task.meta.get("num_docs", 0))
    md.setdefault("data_source", task.meta.get("dataset", "hotpotqa"))
    return {"prompt": task.question, "label": task.meta.get("label", task.answers[0]), "metadata": md}
