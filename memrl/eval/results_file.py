"""A `memrl eval` run's results.jsonl: reading it back after a kill (a half-written last line dropped,
unreadable lines counted), the key a row resumes by (the source file's digest, dataset, length, task,
sample), and the digest of the weights its rows were answered with.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from memrl.model_files import weights_digest

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


def file_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The source file of a row: name, resolved path, size and the first 16 hex digits of its SHA-256."""
    p = Path(path)
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"file": p.name, "file_path": str(p.resolve()), "file_bytes": p.stat().st_size,
            "file_sha256": h.hexdigest()[:16]}


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
