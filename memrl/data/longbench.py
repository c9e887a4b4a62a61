"""LongBench / LongBench-E rows (THUDM/LongBench, `data/<dataset>.jsonl` and `<dataset>_e.jsonl`) to `Task`.

A row: {input (the question; may be empty for summarization sets), context (the long text), answers (a list
of strings), length (the context's length: words for English, characters for Chinese), dataset, language,
all_classes (the label set of classification sets, else null), _id}. Task: question = input, context,
answers; task id = `_id` (else the row number); meta keeps length, language, all_classes and dataset.

Length buckets (LongBench-E reports each set in buckets of `length`: 0-4k, 4-8k, 8k+):
`meta["length_bucket"]` is the lower bound of the row's bucket (0, 4000 or 8000 by default; any sorted
bound list with `buckets=`), and memrl eval uses it as the row's N, so the report has one line per
(dataset, bucket); `meta["length_bucket_name"]` names it ("0-4k", "4-8k", "8k+").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, parse_records, require, row_of
from memrl.types import Task

LONGBENCH_E_BUCKETS: tuple[int, ...] = (4000, 8000)
"""Upper bounds of LongBench-E's first buckets: 0-4k, 4-8k, then 8k+."""


def _k(n: int) -> str:
    return f"{n // 1000}k" if n and n % 1000 == 0 else str(n)


def bucket_of(length: int, bounds: Sequence[int] = LONGBENCH_E_BUCKETS) -> tuple[int, str]:
    """(lower bound, name) of the bucket `length` falls in: [0, b1) is "0-4k", ..., [b_last, inf) "8k+"."""
    lo = 0
    for b in bounds:
        if length < b:
            short = lo % 1000 == 0 and b % 1000 == 0  # LongBench-E's spelling: 0-4k, 4-8k
            return lo, f"{lo // 1000 if short else lo}-{_k(b)}"
        lo = b
    return lo, f"{_k(lo)}+"


def check_buckets(bounds: Sequence[int]) -> list[int]:
    out = [int(b) for b in bounds]
    if not out or any(b <= 0 for b in out) or out != sorted(set(out)):
        raise DataError(f"length buckets must be increasing positive bounds (e.g. 4000,8000), got {list(bounds)}")
    return out


def load_longbench(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None, buckets: Sequence[int] = LONGBENCH_E_BUCKETS,
) -> list[Task]:
    """Tasks from a LongBench JSONL file, each labelled with its length bucket."""
    bounds = check_buckets(buckets)

    def parse(rec: Any, where: str) -> Task:
        question = require(rec, "input", str, where)
        context = require(rec, "context", str, where)
        answers = require(rec, "answers", list, where)
        if not answers or not all(isinstance(a, str) for a in answers):
            raise DataError(f"{where}: field 'answers' must be a non-empty list of strings, got {answers!r:.80}")
        length = rec.get("length")
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise DataError(f"{where}: field 'length' must be a non-negative integer (LongBench's context "
                            f"length), got {length!r}")
        lo, name = bucket_of(length, bounds)
        meta: dict[str, Any] = {k: rec[k] for k in ("language", "all_classes") if k in rec}
        meta.update(length=length, length_bucket=lo, length_bucket_name=name, layout="longbench")
        ds = rec.get("dataset")
        meta["dataset"] = ds if isinstance(ds, str) and ds else "longbench"
        tid = rec.get("_id")
        return Task(task_id=str(tid) if isinstance(tid, str | int) and str(tid) else str(row_of(where)),
                    question=question, context=context, answers=list(answers), meta=meta)

    return parse_records(path, parse, skip_bad=skip_bad, limit=limit, stats=stats)
