"""JSON records of trajectory segments, as eval rows and training dumps store them for `memrl view`.

One record per model call: its kind, token counts (prompt = the call's context length), the generated
text, step reward / advantage / trained tokens, and every `Segment.info` key made JSON-safe (workflows
add keys freely: MemAct's tool_calls, tool_results, prunes, context_tokens pass through unchanged).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from memrl.types import Segment

# Info keys that repeat the record's own fields or are reconstructible; left out to keep rows small.
_DROP = {"answer_text", "response_text"}


def json_safe(value: Any) -> Any:
    """`value` with tuples as lists, non-finite floats as None and unknown objects as their str()."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [json_safe(v) for v in value]
    try:  # numpy / torch scalars
        return json_safe(value.item())
    except (AttributeError, ValueError, TypeError):
        return str(value)


def segment_record(seg: Segment, tokenizer: Any = None) -> dict[str, Any]:
    """The record of one model call; `tokenizer` decodes the response when info holds no text of it."""
    info = seg.info
    text = info.get("response_text")
    if text is None:
        text = info.get("answer_text") if info.get("kind") == "final" else None
    if text is None and tokenizer is not None:
        text = tokenizer.decode(seg.response_ids, skip_special_tokens=True).strip()
    if text is None:
        text = info.get("memory", "")
    return {
        "kind": str(info.get("kind", "call")),
        "step": seg.step,
        "prompt_tokens": len(seg.prompt_ids),
        "response_tokens": len(seg.response_ids),
        "trained_tokens": seg.num_trained_tokens,
        "response": text,
        "step_reward": json_safe(seg.step_reward),
        "advantage": json_safe(seg.advantage),
        "info": {k: json_safe(v) for k, v in info.items() if k not in _DROP},
    }


def segment_records(segments: Sequence[Segment], tokenizer: Any = None) -> list[dict[str, Any]]:
    return [segment_record(s, tokenizer) for s in segments]


def dumps(row: dict[str, Any]) -> str:
    """One compact JSONL line."""
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def write_csv(path: str | os.PathLike[str], rows: Sequence[Any], columns: Sequence[str]) -> None:
    """Dataclass rows as CSV, the `columns` of each in that order: floats at full precision (repr), None empty."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        for row in rows:
            d = asdict(row)
            w.writerow({k: repr(d[k]) if isinstance(d[k], float) else ("" if d[k] is None else d[k]) for k in columns})
