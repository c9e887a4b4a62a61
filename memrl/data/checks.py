"""Checks every loaded task passes, whatever its file layout (`memrl.data.io.parse_records` runs them per row).

A task must be scorable and nameable: at least one gold answer, no question (or sub-question) whose golds
are all empty (or invisible) text, and a task id no earlier row of the same file used (results, resume keys and rollout
groups are keyed by it). Each check returns what is wrong in words, or None; the reader adds file and row.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from memrl.types import Task

_SURROGATE = re.compile("[\ud800-\udfff]")


def bad_text(text: str) -> str | None:
    """'a lone surrogate \\ud800 (not valid Unicode text) at character N', or 'a byte that is not UTF-8
    (0xff) at character N' for one read with errors="surrogateescape"; None for valid text."""
    m = _SURROGATE.search(text)
    if m is None:
        return None
    c = ord(m.group())
    what = (f"a byte that is not UTF-8 (0x{c - 0xDC00:02x})" if 0xDC80 <= c <= 0xDCFF
            else f"a lone surrogate \\u{c:04x} (not valid Unicode text)")
    return f"{what} at character {m.start()}"


def text_problem(value: Any, field: str = "") -> str | None:
    """What makes a record's text unusable, naming the field: a lone surrogate (a JSON "\\ud800" escape, or
    a byte that is not UTF-8 read with errors="surrogateescape") anywhere in its strings, keys included;
    tokenizers and terminals refuse such text, so it is refused when the file is read. None when clean."""
    if isinstance(value, str):
        what = bad_text(value)
        return f"field '{field or 'value'}' holds {what}" if what else None
    if isinstance(value, dict):
        for k, v in value.items():
            name = f"{field}.{k}" if field else str(k)
            problem = text_problem(k, name) or text_problem(v, name)
            if problem:
                return problem
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            problem = text_problem(v, f"{field}[{i}]")
            if problem:
                return problem
    return None


def gold_groups(task: Task) -> list[list[str]]:
    """The gold answers per question: one list for a single-question task, one per sub-question for a
    multi-question one (meta.sub_answers when present, else one answer per sub-question)."""
    subs: Any = task.meta.get("sub_answers")
    if isinstance(subs, list) and subs:
        return [[str(a) for a in (s if isinstance(s, list) else [s])] for s in subs]
    questions = task.meta.get("sub_questions")
    if isinstance(questions, list) and len(questions) > 1 and len(questions) == len(task.answers):
        return [[a] for a in task.answers]
    return [list(task.answers)]


def visible(text: str) -> bool:
    """Whether `text` has a character that is neither whitespace nor invisible (format / control characters:
    a zero-width space, joiner or BOM), so it can match a prediction; str.strip() keeps those."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cf", "Cc", "Zs", "Zl", "Zp") for ch in text)


def gold_problem(task: Task) -> str | None:
    """Why `task` can never be scored (no gold answer, or a question whose golds are all empty); None if fine."""
    if not task.answers:
        return "no gold answers (field 'answers' is empty); every task is scored, so it needs at least one"
    groups = gold_groups(task)
    empty = [i for i, g in enumerate(groups, start=1) if not any(visible(a) for a in g)]
    if not empty:
        return None
    if len(groups) == 1:
        return f"every gold answer is empty ({task.answers!r:.80}); the task can never be scored"
    which = ("sub-question " if len(empty) == 1 else "sub-questions ") + ", ".join(str(i) for i in empty)
    return (f"the gold answers of {which} (of {len(groups)}) are all empty; "
            "the task can never be scored")


class DuplicateIds:
    """The row of each task id accepted from one file; `problem` names the earlier row of a repeated id."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}

    def problem(self, task_id: str, row: int) -> str | None:
        first = self.rows.setdefault(task_id, row)
        if first == row:
            return None
        return (f"task id {task_id!r} is already used by row {first}; task ids must be unique within a file "
                "(results and resume are keyed by them)")
