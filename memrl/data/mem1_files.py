"""MEM1's multi-objective training / test rows (MIT-MI/MEM1 Mem1/gen_data/data_process/
qa_search_*_merge_multi.py): `data_source`, `prompt` (one user message: the instructions and the k
questions joined by "; "), `ability`, `reward_model` {style, ground_truth: {target: [aliases of question 1,
aliases of question 2, ...]}}, `extra_info` {split, indices}. No context: the agent searches.

A row becomes a Task whose question is the whole prompt text (the instructions included, as the published
agent sees it; use it with `workflow=mem1 workflow.prompt_template={question}`, as mem1_official does),
answers the first alias of each objective and `meta.sub_answers` every alias list, the layout memrl's
multi-objective rewards read (memrl.rewards.multiq.gold_aliases).
"""

from __future__ import annotations

import os
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, parse_records, require
from memrl.types import Task


def is_mem1_row(rec: Any) -> bool:
    """A row in MEM1's layout: a reward_model whose ground_truth is an object with a `target` list."""
    rm = rec.get("reward_model") if isinstance(rec, dict) else None
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    return isinstance(gt, dict) and isinstance(gt.get("target"), list)


def _aliases(val: Any, where: str, i: int) -> list[str]:
    if isinstance(val, str):
        val = [val]
    if hasattr(val, "tolist"):  # a numpy array from parquet
        val = val.tolist()
    if not isinstance(val, list) or not val or not all(isinstance(a, str) and a.strip() for a in val):
        raise DataError(f"{where}: reward_model.ground_truth.target[{i}] must be a non-empty list of answer "
                        f"strings, got {val!r}")
    return list(val)


def parse_mem1_row(rec: Any, where: str) -> Task:
    """One MEM1 row to a Task (see the module docstring); DataError naming the row and field otherwise."""
    data_source = require(rec, "data_source", str, where)
    prompt = rec.get("prompt")
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[-1], dict) \
            or not isinstance(prompt[-1].get("content"), str):
        raise DataError(f"{where}: field 'prompt' must be a list of {{role, content}} messages")
    if not is_mem1_row(rec):
        raise DataError(f"{where}: field 'reward_model.ground_truth' must be an object with a 'target' list "
                        "(one alias list per objective)")
    target = rec["reward_model"]["ground_truth"]["target"]
    subs = [_aliases(t, where, i) for i, t in enumerate(target)]
    extra = rec.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' must be an object, got {type(extra).__name__}")
    idx = extra.get("indices")
    if hasattr(idx, "tolist"):
        idx = idx.tolist()
    row = where.rsplit(" ", 1)[-1]
    tid = f"{data_source}-{'-'.join(str(i) for i in idx)}" if isinstance(idx, list) and idx else f"{data_source}-{row}"
    return Task(task_id=tid, question=prompt[-1]["content"], context="", answers=[s[0] for s in subs],
                meta={"sub_answers": subs, "data_source": data_source, "dataset": data_source,
                      "ability": rec.get("ability"), "split": extra.get("split")})


def load_mem1(path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
              stats: ReadStats | None = None) -> list[Task]:
    """Tasks from a MEM1 parquet / JSON / JSONL file."""
    return parse_records(path, parse_mem1_row, skip_bad=skip_bad, limit=limit, stats=stats)
