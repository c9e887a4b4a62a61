"""2WikiMultihopQA to `Task`, in the original `dev.json` layout and the HF layout.

Same paragraph / supporting-fact layout as HotpotQA (see memrl.data.hotpotqa); the extra fields
(`type`, `evidences`, `entity_ids`, `evidences_id`, `answer_id`) are kept in `Task.meta`. A few source
supporting facts point past the end of their paragraph; they are kept as they are, never an error.
"""

from __future__ import annotations

import os
from typing import Any

from memrl.data import hotpotqa
from memrl.data.files import ReadStats, parse_records
from memrl.types import Task

TWOWIKI_EXTRA_FIELDS = ("type", "evidences", "entity_ids", "evidences_id", "answer_id")
_LIST_FIELDS = ("evidences", "evidences_id")


def parse_twowiki_record(rec: Any, where: str) -> Task:
    return hotpotqa.parse_multihop_record(rec, where, "2wikimultihopqa", TWOWIKI_EXTRA_FIELDS, _LIST_FIELDS)


def load_twowiki(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """2WikiMultihopQA tasks from a JSON / JSONL / parquet file in the original or the HF layout."""
    return parse_records(path, parse_twowiki_record, skip_bad=skip_bad, limit=limit, stats=stats)


def to_original_record(task: Task) -> dict[str, Any]:
    """A 2Wiki Task back in the original `dev.json` layout."""
    return hotpotqa.to_original_record(task, TWOWIKI_EXTRA_FIELDS)


def to_hf_record(task: Task) -> dict[str, Any]:
    """A 2Wiki Task in the HF layout."""
    return hotpotqa.to_hf_record(task, TWOWIKI_EXTRA_FIELDS)
