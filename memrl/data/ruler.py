"""RULER synthetic tasks (NIAH, variable tracking, CWE / FWE, QA) to `Task`, in two published layouts.

- RULER (NVIDIA/RULER scripts/data/prepare.py -> `<seq_len>/data/<task>/validation.jsonl`): one row
  {index, input, outputs, length, length_w_model_temp, answer_prefix[, token_position_answer]}; `input` is
  the whole prompt (instruction, haystack, question), the answer prefix already cut off into its own field.
  A memory agent needs the question apart from the text it reads, so the last line of `input` (the
  question in every RULER template) becomes `Task.question` and the text before it `Task.context`. Files
  made with `--remove_newline_tab` have no line to split at and are refused.
- MemAgent's RULER OOD files (taskutils/memory_data/ruler_data_prepare.py -> `eval_<task>_<seq_len>.json`):
  {index, input (the instruction and question), context, outputs, answer_prefix[, length]}; `context` is
  the haystack text, or document indices (QA sets past 2M tokens) rebuilt with a docs_from file
  (memrl.data.index_only).

Every row: answers = `outputs`; task id = the row number from 0 (RULER's niah writes the answer's character
position into `index`, so it is kept in meta but does not name the row); `meta["dataset"]` = the task name
(from `eval_<task>_<len>` or the `<task>/` folder), `meta["seq_length"]` = the length label when the file
name or folder gives one, `meta["metric"]` = how RULER scores the task: "string_match_part" for qa_*
(any gold answer contained in the prediction), "string_match_all" otherwise (the fraction of gold
answers contained; scripts/eval/synthetic/constants.py). MemAgent scores its qa_* files with its QA
metrics (memory_eval/ruler_general.py) instead, so those rows get no `metric` and the default QA scoring.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, first_record, parse_records, require, row_of
from memrl.data.index_only import (
    DocumentList,
    document_list,
    missing_docs_error,
    rebuild_context,
)
from memrl.data.kinds import is_index_list
from memrl.types import Task

RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")
# eval_<name>_<N>, and ReMemR1's subsets eval_<name>_<N>_min_distance_<d> (named "<name>_min_distance_<d>")
_EVAL_NAME = re.compile(r"^eval_(?P<task>.+?)_(?P<len>\d+)(?P<suffix>_min_distance_\d+)?$")


def file_stem(path: str | os.PathLike[str]) -> str:
    """The file name without its data and compression suffixes (eval_qa_1_8192.json.xz -> eval_qa_1_8192)."""
    name = Path(path).name
    for suf in (".xz", ".gz", ".bz2"):
        name = name.removesuffix(suf)
    for suf in (".jsonl", ".json", ".ndjson", ".parquet", ".pq"):
        name = name.removesuffix(suf)
    return name


def name_label(path: str | os.PathLike[str]) -> tuple[str, int | None]:
    """(dataset or task, length) that a file's name or folders give: `eval_<name>_<N>.json` or RULER's
    `<seq_len>/data/<task>/<subset>.jsonl`; ("", None) when neither."""
    m = _EVAL_NAME.match(file_stem(path))
    if m:
        return m.group("task") + (m.group("suffix") or ""), int(m.group("len"))
    p = Path(path).resolve()
    if file_stem(p) in ("validation", "test") and len(p.parents) > 3 and p.parents[1].name == "data":
        n = p.parents[2].name
        return p.parent.name, int(n) if n.isdigit() else None
    return "", None


def metric_for(task: str) -> str:
    """RULER's metric for a task name: string_match_part for its QA tasks, string_match_all otherwise."""
    return "string_match_part" if task.startswith("qa") else "string_match_all"


def _outputs(rec: dict[str, Any], where: str) -> list[str]:
    out = require(rec, "outputs", (list, str), where)
    out = [out] if isinstance(out, str) else out
    if not out or not all(isinstance(a, str) for a in out):
        raise DataError(f"{where}: field 'outputs' must be a non-empty list of strings, got {out!r:.80}")
    return list(out)


def make_parser(path: str | os.PathLike[str], docs: DocumentList | None = None):
    """The row parser for one RULER file (its task name and length come from the path)."""
    task_name, length = name_label(path)

    def parse(rec: Any, where: str) -> Task:
        text = require(rec, "input", str, where)
        answers = _outputs(rec, where)
        memagent = "context" in rec
        if memagent:
            ctx = rec["context"]
            if is_index_list(ctx):
                if docs is None:
                    raise missing_docs_error(str(path), row_of(where))
                ctx = rebuild_context(ctx, docs, where)
            elif not isinstance(ctx, str):
                raise DataError(f"{where}: field 'context' must be text or a list of document indices")
            question, context = text, ctx
        else:
            cut = text.rstrip("\n").rfind("\n")
            if cut < 0:
                raise DataError(f"{where}: field 'input' has no line break, so the question cannot be told from "
                                "the text it asks about (RULER files made with --remove_newline_tab are not "
                                "supported)")
            context, question = text[:cut], text[cut + 1 :].strip()
        meta: dict[str, Any] = {k: v for k, v in rec.items() if k not in ("input", "outputs", "context")}
        meta["dataset"] = task_name or "ruler"
        if length is not None:
            meta["seq_length"] = length
        if not (memagent and task_name.startswith("qa")):
            meta["metric"] = metric_for(task_name)
        meta["layout"] = "memagent" if memagent else "ruler"
        return Task(task_id=str(row_of(where)), question=question, context=context, answers=answers, meta=meta)

    return parse


def load_ruler(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None, docs_from: str | os.PathLike[str] | None = None,
) -> list[Task]:
    """Tasks from a RULER file (either layout); index-only contexts need `docs_from`."""
    docs = document_list(docs_from) if docs_from else None
    first = first_record(path)
    if docs is None and isinstance(first, dict) and is_index_list(first.get("context")):
        raise missing_docs_error(str(path), 0)
    return parse_records(path, make_parser(path, docs), skip_bad=skip_bad, limit=limit, stats=stats)
