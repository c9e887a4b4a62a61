"""LongMemEval (xiaowu0162/LongMemEval: longmemeval_s, longmemeval_m, longmemeval_oracle) to `Task`.

Each file is a JSON list of 500 questions. A question: {question_id, question_type (single-session-user,
single-session-assistant, single-session-preference, multi-session, temporal-reasoning, knowledge-update),
question, answer (a string, or a number; for a preference question a rubric of the desired reply; for an
abstention question why it cannot be answered), question_date (e.g. "2023/05/30 (Tue) 23:40"),
haystack_session_ids, haystack_dates and haystack_sessions (three parallel lists: the chat history, sorted
by date in _s and _m, in file order in _oracle, which holds only the evidence sessions), answer_session_ids
(the evidence sessions)}. A session is a list of turns {role: user | assistant, content}; a turn holding
evidence also has has_answer: true. A question whose question_id ends in "_abs" is an abstention question:
the history does not hold the answer, and the right reply says so.

Task: the context is the history, every session in file order under a header with its number and date,
each turn "<role>: <content>", sessions separated by blank lines (has_answer is not shown). question =
"(Current date: <question_date>) <question>", so every step of a workflow sees when the question is asked;
answers = [str(answer)]; task id = question_id. meta: dataset ("longmemeval_s", "longmemeval_m" or
"longmemeval_oracle" from the file name, else "longmemeval"), question_type, abstention (bool),
question (as in the file: what the judge is shown), question_date, answer_session_ids, sessions (how
many), evidence_turns ([session index, turn index] of each has_answer turn), metric "longmemeval_rule"
(memrl's rule score, not the official one: memrl.rewards.longmemeval) and judge "longmemeval" (the
official score is an LLM judge's: `memrl eval judge.url=...`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, parse_records, require
from memrl.types import Task

QUESTION_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference", "multi-session",
                  "temporal-reasoning", "knowledge-update")
"""LongMemEval's question types (README: Dataset Format)."""
ABSTENTION_SUFFIX = "_abs"
METRIC = "longmemeval_rule"
JUDGE = "longmemeval"
_VARIANT = re.compile(r"longmemeval_(s|m|oracle)(?![a-z])", re.IGNORECASE)


def is_abstention(question_id: str) -> bool:
    """Whether a question is an abstention one: its id ends in "_abs" (LongMemEval's convention)."""
    return question_id.endswith(ABSTENTION_SUFFIX)


def dataset_name(path: str | os.PathLike[str]) -> str:
    """"longmemeval_s" / "longmemeval_m" / "longmemeval_oracle" from the file's name, else "longmemeval"."""
    m = _VARIANT.search(Path(path).name)
    return f"longmemeval_{m.group(1).lower()}" if m else "longmemeval"


def render_history(rec: dict[str, Any], where: str) -> tuple[str, list[list[int]]]:
    """(the context, [session index, turn index] of each evidence turn) of one question's history."""
    sessions = require(rec, "haystack_sessions", list, where)
    dates = require(rec, "haystack_dates", list, where)
    if len(dates) != len(sessions):
        raise DataError(f"{where}: haystack_dates has {len(dates)} dates for {len(sessions)} haystack_sessions")
    parts, evidence = [], []
    for s, (date, turns) in enumerate(zip(dates, sessions, strict=True)):
        here = f"{where}: haystack_sessions[{s}]"
        if not isinstance(date, str):
            raise DataError(f"{where}: haystack_dates[{s}] must be a string, got {type(date).__name__}")
        if not isinstance(turns, list):
            raise DataError(f"{here} must be a list of turns, got {type(turns).__name__}")
        lines = [f"[Session {s + 1}, {date}]"]
        for t, turn in enumerate(turns):
            role = require(turn, "role", str, f"{here}[{t}]")
            content = require(turn, "content", str, f"{here}[{t}]")
            lines.append(f"{role}: {content}")
            if turn.get("has_answer") is True:
                evidence.append([s, t])
        parts.append("\n".join(lines))
    return "\n\n".join(parts), evidence


def make_parser(dataset: str) -> Callable[[Any, str], Task]:
    """The parse function (for parse_records) of a file whose questions belong to `dataset`."""

    def parse(rec: Any, where: str) -> Task:
        qid = require(rec, "question_id", (str, int), where)
        qid = str(qid)
        qtype = require(rec, "question_type", str, where)
        if qtype not in QUESTION_TYPES:
            raise DataError(f"{where}: field 'question_type' must be one of {', '.join(QUESTION_TYPES)}, got "
                            f"{qtype!r}")
        question = require(rec, "question", str, where)
        answer = rec.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise DataError(f"{where}: field 'answer' must be a string or a number, got {type(answer).__name__}")
        date = require(rec, "question_date", str, where)
        context, evidence = render_history(rec, where)
        ids = rec.get("answer_session_ids")
        meta: dict[str, Any] = {
            "dataset": dataset, "layout": "longmemeval", "question_type": qtype, "abstention": is_abstention(qid),
            "question": question, "question_date": date,
            "answer_session_ids": list(ids) if isinstance(ids, list) else [],
            "sessions": len(rec["haystack_sessions"]), "evidence_turns": evidence, "metric": METRIC, "judge": JUDGE,
        }
        return Task(task_id=qid, question=f"(Current date: {date}) {question}", context=context,
                    answers=[str(answer)], meta=meta)

    return parse


def load_longmemeval(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a LongMemEval file (_s, _m or _oracle; one per question)."""
    return parse_records(path, make_parser(dataset_name(path)), skip_bad=skip_bad, limit=limit, stats=stats)
