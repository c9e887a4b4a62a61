"""MemAct's multi-objective QA tasks: 2-3 HotpotQA / 2Wiki questions asked together, and their parquet layout.

Task layout (shared with the memact workflow and the multi-question reward): `question` lists the
sub-questions numbered 1..k, `context` is empty (the agent searches), `answers` holds each sub-question's
primary answer in order, `meta` = {sub_questions, sub_answers (aliases per sub-question), source,
source_ids, index}.

Parquet row (MemAct's layout): `data_source`, `prompt` [system, user], `ability`, `agent_name`,
`reward_model` {style, ground_truth: JSON text of the answer list}, `extra_info` {index, id, question,
ground_truth, sub_questions, sub_answers, source, source_ids}. A reader also accepts ground_truth as a list.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from typing import Any

from memrl.data.io import DataError, ReadStats, parse_records, require, write_records
from memrl.types import Task

DATA_SOURCE = "memact_multiobjective"
AGENT_NAME = "memact"
ABILITY = "multi_objective_qa"
SYSTEM_PROMPT = (
    "You answer several questions by searching a document collection. Use the tools to search, keep "
    "your working context short, and end with FINAL_ANSWER: followed by a JSON object mapping each "
    "question number to its answer."
)
_META = ("sub_questions", "sub_answers", "source", "source_ids", "index")


def combined_question(sub_questions: Sequence[str]) -> str:
    """The task's question: the sub-questions numbered from 1, one per line."""
    lines = [f"Answer the following {len(sub_questions)} questions."]
    lines += [f"{i}. {q.strip()}" for i, q in enumerate(sub_questions, start=1)]
    return "\n".join(lines)


def build_multiobjective(
    pool: Sequence[Task], num_tasks: int, seed: int = 42, sizes: Sequence[int] = (2, 3)
) -> list[Task]:
    """`num_tasks` tasks (0 = as many as the pool allows) of `sizes` sub-questions; no question used twice.

    The pool order is shuffled with `random.Random(seed)` and each task's size drawn from the same stream,
    so the same pool and seed give the same tasks.
    """
    if not sizes or any(k < 1 for k in sizes):
        raise ValueError(f"sizes must be positive sub-question counts, got {list(sizes)}")
    if num_tasks < 0:
        raise ValueError(f"num_tasks must be >= 0, got {num_tasks}")
    rng = random.Random(seed)
    order = list(range(len(pool)))
    rng.shuffle(order)
    tasks: list[Task] = []
    pos = 0
    while num_tasks == 0 or len(tasks) < num_tasks:
        k = rng.choice(list(sizes))
        if pos + k > len(order):
            break
        subs = [pool[j] for j in order[pos : pos + k]]
        pos += k
        sources = sorted({str(t.meta.get("dataset", "unknown")) for t in subs})
        index = len(tasks)
        tasks.append(Task(
            task_id=f"{DATA_SOURCE}-{index}",
            question=combined_question([t.question for t in subs]),
            context="",
            answers=[t.answers[0] for t in subs],
            meta={"sub_questions": [t.question.strip() for t in subs],
                  "sub_answers": [list(t.answers) for t in subs],
                  "source": "+".join(sources), "source_ids": [t.task_id for t in subs], "index": index},
        ))
    if num_tasks and len(tasks) < num_tasks:
        raise ValueError(f"the pool of {len(pool)} questions makes only {len(tasks)} of the {num_tasks} tasks "
                         f"asked for (sizes {list(sizes)})")
    if not tasks:
        raise ValueError(f"the pool of {len(pool)} questions is too small for one task of sizes {list(sizes)}")
    return tasks


def to_row(task: Task, system_prompt: str = SYSTEM_PROMPT) -> dict[str, Any]:
    """A multi-objective Task as a MemAct parquet row."""
    m = task.meta
    gt = json.dumps(list(task.answers), ensure_ascii=False)
    return {
        "data_source": m.get("data_source", DATA_SOURCE),
        "prompt": [{"role": "system", "content": m.get("system_prompt", system_prompt)},
                   {"role": "user", "content": task.question}],
        "ability": m.get("ability", ABILITY),
        "agent_name": m.get("agent_name", AGENT_NAME),
        "reward_model": {"style": "rule", "ground_truth": gt},
        "extra_info": {"index": m.get("index"), "id": task.task_id, "question": task.question,
                       "ground_truth": gt, "sub_questions": list(m["sub_questions"]),
                       "sub_answers": [list(a) for a in m["sub_answers"]], "source": m.get("source", ""),
                       "source_ids": list(m.get("source_ids", []))},
    }


def _str_list(val: Any, where: str, field: str) -> list[str]:
    if isinstance(val, str):  # JSON text (MemAct writes ground_truth this way)
        try:
            val = json.loads(val)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: field '{field}' is not valid JSON: {e.msg}") from e
    if not isinstance(val, list) or not val or not all(isinstance(a, str) for a in val):
        raise DataError(f"{where}: field '{field}' must be a non-empty list of strings, got {val!r:.80}")
    return list(val)


def parse_row(rec: Any, where: str) -> Task:
    """One MemAct parquet row to a Task (the layout in the module docstring)."""
    data_source = require(rec, "data_source", str, where)
    prompt = require(rec, "prompt", list, where)
    if not prompt or not all(isinstance(p, dict) and isinstance(p.get("content"), str) for p in prompt):
        raise DataError(f"{where}: field 'prompt' must be a list of {{role, content}} messages")
    rm = require(rec, "reward_model", dict, where)
    answers = _str_list(rm.get("ground_truth"), where, "reward_model.ground_truth")
    extra = require(rec, "extra_info", dict, where)
    question = extra.get("question") if isinstance(extra.get("question"), str) else prompt[-1]["content"]
    subs = _str_list(extra.get("sub_questions"), where, "extra_info.sub_questions")
    if len(subs) != len(answers):
        raise DataError(f"{where}: {len(subs)} sub_questions but {len(answers)} answers in reward_model.ground_truth")
    aliases = extra.get("sub_answers")
    if aliases is None:
        aliases = [[a] for a in answers]
    if isinstance(aliases, str):
        try:
            aliases = json.loads(aliases)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: field 'extra_info.sub_answers' is not valid JSON: {e.msg}") from e
    if (not isinstance(aliases, list) or len(aliases) != len(answers)
            or not all(isinstance(a, list) and a and all(isinstance(x, str) for x in a) for a in aliases)):
        raise DataError(f"{where}: field 'extra_info.sub_answers' must hold one non-empty list of strings "
                        f"per sub-question ({len(answers)})")
    ids = extra.get("source_ids") or []
    meta: dict[str, Any] = {"sub_questions": subs, "sub_answers": [list(a) for a in aliases],
                            "source": str(extra.get("source") or ""), "source_ids": [str(i) for i in ids],
                            "index": extra.get("index")}
    system = prompt[0]["content"] if prompt[0].get("role") == "system" else ""
    for key, val, default in (("data_source", data_source, DATA_SOURCE), ("system_prompt", system, SYSTEM_PROMPT),
                              ("ability", rec.get("ability"), ABILITY),
                              ("agent_name", rec.get("agent_name"), AGENT_NAME)):
        if val != default:
            meta[key] = val
    tid = str(extra.get("id") or f"{data_source}-{extra.get('index', where.rsplit(' ', 1)[-1])}")
    return Task(task_id=tid, question=question, context="", answers=answers, meta=meta)


def load_multiobjective(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a MemAct multi-objective file (parquet, JSON or JSONL rows)."""
    return parse_records(path, parse_row, skip_bad=skip_bad, limit=limit, stats=stats)


def write_multiobjective(path: str | os.PathLike[str], tasks: Iterable[Task],
                         system_prompt: str = SYSTEM_PROMPT) -> int:
    """Write tasks as MemAct rows in the format the file name says; returns the count."""
    tasks = list(tasks)
    for t in tasks:
        missing = [k for k in ("sub_questions", "sub_answers") if k not in t.meta]
        if missing:
            raise DataError(f"task {t.task_id}: not a multi-objective task (meta lacks {', '.join(missing)})")
    return write_records(path, [to_row(t, system_prompt) for t in tasks])
