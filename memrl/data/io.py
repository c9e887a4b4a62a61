"""Reading any supported data file: `load_tasks` picks the loader for a file (its kind given, or detected
from the first record by memrl.data.kinds) and returns its Tasks.

The readers and writers every loader shares live in memrl.data.files (DataError in memrl.data.errors)
and are re-exported here, so `from memrl.data.io import load_tasks, DataError, write_records` keeps
working. This module imports the loaders; none of them imports it (dependencies run one way).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from memrl.data import (
    hotpotqa,
    locomo,
    longbench,
    longmemeval,
    mem1_files,
    memagent_files,
    multiobjective,
    ruler,
    slime,
    tasks_jsonl,
    twowiki,
)
from memrl.data.errors import DataError
from memrl.data.files import (
    ReadStats,
    file_format,
    first_record,
    iter_records,
    open_text,
    parse_records,
    require,
    row_of,
    write_json,
    write_jsonl,
    write_parquet,
    write_records,
)
from memrl.data.kinds import KIND_NAMES, KINDS, detect_kind
from memrl.types import Task

__all__ = ["KINDS", "KIND_NAMES", "DataError", "ReadStats", "detect_kind", "file_format", "first_record",
           "iter_records", "load_tasks", "open_text", "parse_records", "require", "row_of", "write_json",
           "write_jsonl", "write_parquet", "write_records"]


def load_tasks(
    path: str | os.PathLike[str], kind: str = "auto", skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None, docs_from: str | os.PathLike[str] | None = None,
    buckets: Sequence[int] | None = None,
) -> list[Task]:
    """Tasks from any supported file; kind is one of KINDS or "auto" (detected from the first record).

    `buckets`: LongBench files' length-bucket bounds (default LongBench-E's 4000, 8000); others ignore it.

    `docs_from` names the dev file whose documents index-only contexts (eval_index, RULER QA past 2M
    tokens) are rebuilt from; other kinds ignore it.
    """
    if kind == "auto":
        kind = detect_kind(path)
    loaders = {
        "hotpotqa": hotpotqa.load_hotpotqa,
        "2wiki": twowiki.load_twowiki,
        "memagent": memagent_files.load_memagent_parquet,
        "multiobjective": multiobjective.load_multiobjective,
        "mem1": mem1_files.load_mem1,
        "tasks": tasks_jsonl.load_task_file,
        "slime": slime.load_slime,
        "locomo": locomo.load_locomo,
        "longmemeval": longmemeval.load_longmemeval,
    }
    if kind in ("eval", "eval_index"):
        return memagent_files.load_eval_json(path, skip_bad=skip_bad, limit=limit, stats=stats, docs_from=docs_from)
    if kind == "longbench":
        return longbench.load_longbench(path, skip_bad=skip_bad, limit=limit, stats=stats,
                                        buckets=buckets or longbench.LONGBENCH_E_BUCKETS)
    if kind == "ruler":
        return ruler.load_ruler(path, skip_bad=skip_bad, limit=limit, stats=stats, docs_from=docs_from)
    if kind not in loaders:
        raise DataError(f"unknown data kind {kind!r}; expected auto or one of {', '.join(KINDS)}")
    return loaders[kind](path, skip_bad=skip_bad, limit=limit, stats=stats)
