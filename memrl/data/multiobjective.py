"""MemAct's multi-objective QA tasks: 2-3 HotpotQA / 2Wiki questions asked together, and the published file layout.

Task layout (shared with the memact workflow and the multi-question reward): `question` lists the
sub-questions, `context` is empty (the agent searches), `answers` holds each sub-question's primary
answer in order, `meta` = {sub_questions, sub_answers (aliases per sub-question), source, source_ids, index}
plus, for a task read from a file, `prompt` (the row's chat messages, which drive the agent under
`workflow.prompt_source=auto|row`), `ground_truth` (the row's ground-truth text verbatim: the LLM judge's
gold) and `answer_keys` (["Q1", "Q2", ...] for a Q-keyed ground truth).

Row layout: the one MemAct publishes (its DCPO/data/*.parquet files; field names and value shapes read
from them, no text copied):
  data_source, prompt [system, user], ability, agent_name,
  reward_model {ground_truth},
  extra_info {ground_truth, question, need_tools_kwargs, tools_kwargs}.
The ground truth is text: a JSON object keyed by sub-question, `{"Q1": "...", "Q2": "..."}` (multi-question
rows), or the plain answer (single-question rows, e.g. `wiki_val_512`; "1875" is a plain answer, not JSON).
Published rows carry no sub-question list: the sub-questions are split from `extra_info.question`, which
enumerates them one per line as `Q<n>: <text>` (memrl's own `<n>. <text>` lines are read the same way).
memrl writes the same fields and adds `extra_info.sub_questions`, `sub_answers`, `source`, `source_ids`,
`index` and `id` (ignored by the published code, which reads only `question` and `ground_truth`), so files
round-trip both ways: a published file read and written again gives its rows back, and memrl's rows are
read back to the same tasks. Older memrl files (ground truth a JSON list, sub_questions in extra_info)
still load.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, parse_records, require, write_records
from memrl.types import Task

DATA_SOURCE = "memact_multiobjective"
AGENT_NAME = "mem_agent"
"""The published agent loop is picked by this name (verl's `agent_name` field): a file memrl writes runs there."""
ABILITY = "multi_objective_qa"
_META = ("sub_questions", "sub_answers", "source", "source_ids", "index")
# extra_info keys memrl models; any other key of a read row is kept verbatim (meta["row_extra"])
_EXTRA_KEYS = ("ground_truth", "question", "id", *_META)
_PUBLISHED_QUESTION = re.compile(r"^Q(\d+):[ \t]*(\S.*?)\s*$", re.MULTILINE)
_NUMBERED_QUESTION = re.compile(r"^(\d+)\.[ \t]+(\S.*?)\s*$", re.MULTILINE)
_KEY_NUMBER = re.compile(r"\d+")


def combined_question(sub_questions: Sequence[str]) -> str:
    """The task's question: the sub-questions numbered from 1, one per line."""
    lines = [f"Answer the following {len(sub_questions)} questions."]
    lines += [f"{i}. {q.strip()}" for i, q in enumerate(sub_questions, start=1)]
    return "\n".join(lines)


def split_sub_questions(question: str) -> list[str]:
    """The sub-questions a question text enumerates: lines `Q<n>: text` (the published files) or, when there
    are none, `<n>. text` (memrl's combined_question), numbered 1..k in order; [] when it enumerates none."""
    for pattern in (_PUBLISHED_QUESTION, _NUMBERED_QUESTION):
        found = pattern.findall(question)
        if found and [int(n) for n, _ in found] == list(range(1, len(found) + 1)):
            return [text for _, text in found]
    return []


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


# ---------------------------------------------------------------------------------------------- ground truth


def ground_truth_text(task: Task) -> str:
    """The row's ground truth: the text read from the file when it still says what `task.answers` says,
    else a JSON object keyed Q1..Qk (k > 1; `json.dumps` defaults, as the published files are written) or
    the plain answer (k = 1)."""
    raw = task.meta.get("ground_truth")
    if isinstance(raw, str):
        try:
            answers, _ = parse_ground_truth(raw, "ground_truth")
        except DataError:
            answers = None
        if answers == list(task.answers):
            return raw
    keys = task.meta.get("answer_keys") or [f"Q{i}" for i in range(1, len(task.answers) + 1)]
    if len(task.answers) == 1 and not task.meta.get("answer_keys"):
        return str(task.answers[0])
    return json.dumps(dict(zip(keys, task.answers, strict=True)))


def parse_ground_truth(val: Any, where: str) -> tuple[list[str], list[str] | None]:
    """(primary answer per sub-question, the Q keys or None) of a ground truth: a JSON object keyed by
    sub-question (text or already an object), a JSON list (memrl's older files) or plain text (one answer)."""
    if isinstance(val, str):
        try:
            parsed = json.loads(val)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict | list):
            val = parsed
        elif val.strip():
            return [val], None  # plain text (also "1875", which JSON would read as a number)
        else:
            raise DataError(f"{where}: the ground truth is empty")
    if isinstance(val, dict):
        return _keyed_answers(val, where)
    if isinstance(val, list) and val and all(isinstance(a, str) for a in val):
        return list(val), None
    raise DataError(f"{where}: expected a JSON object keyed by sub-question ({{\"Q1\": ...}}), a list of "
                    f"answers or plain text, got {val!r:.80}")


def _keyed_answers(obj: dict[str, Any], where: str) -> tuple[list[str], list[str]]:
    nums = [_KEY_NUMBER.search(str(k)) for k in obj]
    if not obj or not all(nums):
        raise DataError(f"{where}: every key of the ground-truth object must number a sub-question (Q1, Q2, ...), "
                        f"got {list(obj)}")
    order = sorted(zip([int(n.group()) for n in nums], obj, strict=True), key=lambda x: x[0])  # type: ignore[union-attr]
    if [n for n, _ in order] != list(range(1, len(order) + 1)):
        raise DataError(f"{where}: the ground-truth keys must number the sub-questions 1..{len(order)}, "
                        f"got {list(obj)}")
    answers = []
    for _, key in order:
        v = obj[key]
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, str | int | float) or not str(v).strip():
            raise DataError(f"{where}: the answer under {key!r} must be non-empty text, got {v!r:.60}")
        answers.append(str(v))
    return answers, [str(k) for _, k in order]


# ---------------------------------------------------------------------------------------------- rows


PromptBuilder = Callable[[Task], list[dict[str, str]]]
"""The prompt messages to write for a task that carries none (`meta["prompt"]`): the agent's prompt, which the
data layer does not build; `memrl data build` passes memrl.workflows.memact.default_prompt."""


def to_row(task: Task, agent_name: str = AGENT_NAME, prompt: PromptBuilder | None = None) -> dict[str, Any]:
    """A multi-objective Task as a row in the published layout (module docstring), plus memrl's extra keys;
    the prompt messages are the task's own, else `prompt(task)`."""
    m = task.meta
    gt = ground_truth_text(task)
    kept = m.get("row_extra") or {}
    extra: dict[str, Any] = {"ground_truth": gt, "question": task.question,
                             "need_tools_kwargs": True, "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": ""}}}}
    extra.update(kept.get("extra_info", {}))
    extra.update(_memrl_extras(task))
    messages = m.get("prompt") or (prompt(task) if prompt is not None else None)
    if not messages:
        raise DataError(f"task {task.task_id}: no prompt messages to write (meta['prompt']) and no prompt builder "
                        "given (prompt=, e.g. memrl.workflows.memact.default_prompt)")
    return {
        "data_source": m.get("data_source", DATA_SOURCE),
        "prompt": [{"content": p["content"], "role": p["role"]} for p in messages],
        "ability": m.get("ability", ABILITY),
        "agent_name": m.get("agent_name", agent_name),
        "reward_model": {**kept.get("reward_model", {}), "ground_truth": gt},
        "extra_info": extra,
    }


def _memrl_extras(task: Task) -> dict[str, Any]:
    """The extra_info keys memrl adds, only where the published fields do not already say it: so a published
    row read and written again comes back as it was."""
    m, out = task.meta, {}
    subs = list(m.get("sub_questions") or [task.question.strip()])
    if subs != (split_sub_questions(task.question) or [task.question.strip()]):
        out["sub_questions"] = subs
    aliases = [list(a) for a in (m.get("sub_answers") or [[a] for a in task.answers])]
    if aliases != [[a] for a in task.answers]:
        out["sub_answers"] = aliases
    for key in ("source", "source_ids"):
        if m.get(key):
            out[key] = list(m[key]) if key == "source_ids" else m[key]
    if m.get("index") is not None:
        out["index"] = m["index"]
    ds = m.get("data_source", DATA_SOURCE)
    default_id = (task.task_id == f"{ds}-{m['index']}" if m.get("index") is not None
                  else re.fullmatch(re.escape(ds) + r"-\d+", task.task_id) is not None)  # the id the reader makes
    if not default_id:
        out["id"] = task.task_id
    return out


def _str_list(val: Any, where: str, field: str) -> list[str]:
    if isinstance(val, str):
        try:
            val = json.loads(val)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: field '{field}' is not valid JSON: {e.msg}") from e
    if not isinstance(val, list) or not val or not all(isinstance(a, str) for a in val):
        raise DataError(f"{where}: field '{field}' must be a non-empty list of strings, got {val!r:.80}")
    return list(val)


def _messages(val: Any, where: str) -> list[dict[str, str]]:
    if (not isinstance(val, list) or not val
            or not all(isinstance(p, dict) and isinstance(p.get("content"), str) and isinstance(p.get("role"), str)
                       for p in val)):
        raise DataError(f"{where}: field 'prompt' must be a non-empty list of {{role, content}} messages")
    return [{"role": p["role"], "content": p["content"]} for p in val]


def parse_row(rec: Any, where: str) -> Task:
    """One row (the published layout or memrl's, module docstring) to a Task."""
    data_source = require(rec, "data_source", str, where)
    prompt = _messages(rec["prompt"], where) if rec.get("prompt") is not None else None
    rm = require(rec, "reward_model", dict, where)
    extra = rec.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' must be an object, got {type(extra).__name__}")
    raw_gt = rm.get("ground_truth", extra.get("ground_truth"))
    if raw_gt is None:
        raise DataError(f"{where}: missing field 'reward_model.ground_truth'")
    answers, keys = parse_ground_truth(raw_gt, f"{where}: field 'reward_model.ground_truth'")
    question = extra.get("question")
    if not isinstance(question, str) or not question.strip():
        users = [p["content"] for p in prompt or [] if p["role"] == "user"]
        if not users:
            raise DataError(f"{where}: no question: neither 'extra_info.question' nor a user message in 'prompt'")
        question = users[-1]
    if extra.get("sub_questions") is not None:
        subs = _str_list(extra["sub_questions"], where, "extra_info.sub_questions")
    else:
        subs = split_sub_questions(question) or [question.strip()]
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
                            "index": extra.get("index"), "ground_truth": raw_gt if isinstance(raw_gt, str)
                            else json.dumps(raw_gt)}
    if keys is not None:
        meta["answer_keys"] = keys
    if prompt is not None:
        meta["prompt"] = prompt
    for key, val, default in (("data_source", data_source, DATA_SOURCE), ("ability", rec.get("ability"), ABILITY),
                              ("agent_name", rec.get("agent_name"), AGENT_NAME)):
        if val != default:
            meta[key] = val
    row_extra = {"reward_model": {k: v for k, v in rm.items() if k != "ground_truth"},
                 "extra_info": {k: v for k, v in extra.items() if k not in _EXTRA_KEYS}}
    if any(row_extra.values()):
        meta["row_extra"] = {k: v for k, v in row_extra.items() if v}
    tid = str(extra.get("id") or f"{data_source}-{extra.get('index', where.rsplit(' ', 1)[-1])}")
    return Task(task_id=tid, question=question, context="", answers=answers, meta=meta)


def load_multiobjective(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a MemAct multi-objective file (parquet, JSON or JSONL rows)."""
    return parse_records(path, parse_row, skip_bad=skip_bad, limit=limit, stats=stats)


def write_multiobjective(path: str | os.PathLike[str], tasks: Iterable[Task], agent_name: str = AGENT_NAME, *,
                         prompt: PromptBuilder | None = None) -> int:
    """Write tasks as rows in the published layout, in the format the file name says; returns the count.
    A task without its own prompt messages gets `prompt(task)` (to_row)."""
    tasks = list(tasks)
    return write_records(path, [to_row(t, agent_name, prompt) for t in tasks])
