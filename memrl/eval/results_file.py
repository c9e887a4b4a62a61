"""A `memrl eval` run's results.jsonl: one question's row (`result_row`, scored by `score_prediction`),
reading the file back after a kill (a half-written last line dropped, unreadable lines counted), the key a
row resumes by (the source file's digest, dataset, length, task, sample), and the digest of the weights its
rows were answered with.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memrl.downloads import sha256_file
from memrl.errors import UserError
from memrl.eval.task_judge import JUDGE_COLUMN
from memrl.model_files import weights_digest
from memrl.records import segment_records
from memrl.rewards.eval_metrics import get_metric, metric_value
from memrl.rewards.extract import extract_prediction
from memrl.rewards.published_metrics import published_qa_metrics, published_task_metric
from memrl.rewards.qa import qa_metrics
from memrl.types import Task, Trajectory

log = logging.getLogger("memrl.eval.runner")


def read_results(path: str | os.PathLike[str], repair: bool = False) -> list[dict[str, Any]]:
    """Rows of a results.jsonl. A last line cut off by a kill is dropped (and cut from the file if repair).

    Any other line that is not a result row (invalid JSON, bytes that are not UTF-8, not an object with
    task_id and num_docs) is skipped and counted; one warning names the file and those lines.
    """
    p = Path(path)
    if not p.exists():
        return []
    data = p.read_bytes()
    end = data.rfind(b"\n") + 1
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for lineno, line in enumerate(data[:end].split(b"\n"), start=1):
        if not line.strip():
            continue
        row, why = _parse_row(line)
        if row is None:
            bad.append(f"line {lineno} ({why})")
        else:
            rows.append(row)
    tail = data[end:]
    if tail.strip():
        row, _ = _parse_row(tail)
        if row is not None:  # a complete last row that only lacks its newline
            rows.append(row)
            if repair:
                with open(p, "ab") as f:
                    f.write(b"\n")
        else:
            log.warning("%s: dropping a half-written last line (%d bytes) from an interrupted run", p, len(tail))
            if repair:
                with open(p, "r+b") as f:
                    f.truncate(end)
    if bad:
        log.warning("%s: skipped %d unreadable line%s: %s%s; their questions count as not done", p, len(bad),
                    "s" if len(bad) > 1 else "", ", ".join(bad[:5]), f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return rows


def _parse_row(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """(row, "") or (None, what is wrong) for one line of results.jsonl."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8: byte 0x{line[e.start]:02x} at column {e.start + 1}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg} at column {e.colno}"
    if not isinstance(row, dict) or not isinstance(row.get("task_id"), str | int) \
            or isinstance(row.get("num_docs"), bool) or not isinstance(row.get("num_docs"), int):
        return None, "not a result row (needs task_id and an integer num_docs)"
    return row, ""


def file_identity(path: str | os.PathLike[str], sha256: str = "") -> dict[str, Any]:
    """The source file of a row: name, resolved path, size and the first 16 hex digits of its SHA-256 (the
    resume key's; `sha256`: the file's full digest where the caller has it, memrl.downloads.sha256_file)."""
    p = Path(path)
    return {"file": p.name, "file_path": str(p.resolve()), "file_bytes": p.stat().st_size,
            "file_sha256": (sha256 or sha256_file(p))[:16]}


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """The resume key of a results row: (file_sha256, dataset, num_docs, task_id, sample); rows written
    before rows carried their file's digest: ("legacy", file name, num_docs, task_id, sample)."""
    if "file_sha256" in row:
        return (row["file_sha256"], row.get("dataset", ""), int(row["num_docs"]), str(row["task_id"]),
                int(row.get("sample", 0)))
    return ("legacy", row.get("file", ""), int(row["num_docs"]), str(row["task_id"]), int(row.get("sample", 0)))


def weights_identity(model: str) -> str | None:
    """The SHA-256 of the model directory's weight files (memrl.model_files.weights_digest), or None where
    `model` is no directory holding any (a tokenizer directory of a served model)."""
    p = Path(model) if model else None
    if p is None or not p.is_dir() or not (any(p.glob("*.safetensors")) or any(p.glob("*.bin"))):
        return None
    return weights_digest(p)


def score_prediction(task: Task, traj: Trajectory, golds: str = "any", extract: str = "boxed",
                     metric_rules: str = "memrl", final_answer: bool = False) -> tuple[str, dict[str, float]]:
    """(prediction, metrics) of a finished question: em / sub_em / f1 of the prediction `extract` reads,
    against all gold answers (golds=any, best of them) or answers[0] (first); plus the eval metric the
    task's meta["metric"] names, over all answers. With `final_answer` (a trajectory that scored itself:
    its workflow's row_columns name em) the prediction is its own final answer. em / sub_em /
    f1 follow `metric_rules` (memrl, or a published evaluation's: memrl.rewards.published_metrics)."""
    if extract == "boxed" or "answer_text" not in traj.info or final_answer:
        pred = traj.final_answer or ""
    else:
        pred = extract_prediction(traj.info["answer_text"], extract)
    answers = task.answers if golds == "any" else task.answers[:1]
    m = qa_metrics(pred, answers) if metric_rules == "memrl" else published_qa_metrics(pred, answers, metric_rules)
    name = task.meta.get("metric")
    if name:
        try:
            get_metric(str(name))
        except KeyError as e:
            raise UserError(f"task {task.task_id}: meta['metric']: {e.args[0]}") from e
        value = metric_value(str(name), pred, task.answers, task.meta)
        m[str(name)] = published_task_metric(value, pred, metric_rules)
    return pred, m


ROW_SCORES = ("em", "sub_em", "f1", "generated_tokens")
"""The standard row columns a workflow's own row_columns may give the value of."""


def result_row(
    task: Task, traj: Trajectory, num_docs: int, file: str, started: float, finished: float, session: str = "",
    tokenizer: Any = None, ident: dict[str, Any] | None = None, dataset: str = "", sample: int = 0,
    golds: str = "any", extract: str = "boxed", metric_rules: str = "memrl",
    row_columns: Callable[[Trajectory], Mapping[str, Any]] | None = None, labels: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSONL row of one finished question; started/finished are wall-clock times (time.time()).
    `ident` is the source file's file_identity(); `steps` holds one memrl.records record per model call
    (what `memrl view` shows). Scoring: `score_prediction`; a task's named eval metric (meta["metric"])
    is a column of its own. `row_columns`: the workflow's own columns (WorkflowSpec.row_columns); `labels`: the
    evaluation row's ROW_COLUMNS (memrl.eval.evaluator.row_labels), after `sample`."""
    own = dict(row_columns(traj)) if row_columns is not None else {}
    pred, m = score_prediction(task, traj, golds, extract, metric_rules, final_answer="em" in own)
    extra = {k: v for k, v in m.items() if k not in ("em", "sub_em", "f1")}
    tm = traj.metrics
    m = {**m, **{k: own[k] for k in ("em", "sub_em", "f1") if k in own}}
    memories = traj.info.get("memories")
    if memories is None:
        memories = [s.info["memory"] for s in traj.segments if s.info.get("kind") != "final" and "memory" in s.info]
    # the question's type (LoCoMo's category name, LongMemEval's question_type): the report's by-type table
    kinds = {k: task.meta[k] for k in ("question_type", "abstention") if task.meta.get(k) not in (None, False)}
    return {
        "task_id": task.task_id,
        "num_docs": num_docs,
        "dataset": dataset,
        "sample": sample,
        **(labels or {}),
        **kinds,
        **(ident or {"file": Path(file).name}),
        "question": task.question,
        "answers": task.answers,
        "prediction": pred,
        "answer_text": traj.info.get("answer_text", ""),
        "memory_trace": list(memories),
        "em": m["em"],
        "sub_em": m["sub_em"],
        "f1": m["f1"],
        **extra,
        **({JUDGE_COLUMN: tm[JUDGE_COLUMN]} if JUDGE_COLUMN in tm else {}),
        "tokens_read": int(tm.get("tokens_read", tm.get("context_tokens", 0))),
        "context_tokens": int(tm.get("context_tokens", 0)),
        "generated_tokens": own.get("generated_tokens", sum(len(s.response_ids) for s in traj.segments)),
        "model_calls": len(traj.segments),
        **{k: v for k, v in own.items() if k not in ROW_SCORES},
        "reward": traj.reward,
        "seconds": round(finished - started, 4),
        "started": round(started, 4),
        "finished": round(finished, 4),
        "session": session,
        "metrics": {k: float(v) for k, v in tm.items()},
        "steps": segment_records(traj.segments, tokenizer),
    }
