"""LoCoMo (snap-research/locomo, `data/locomo10.json`) to `Task`: one task per QA item of a conversation.

The file is a JSON list of conversations. A conversation: {sample_id, conversation, qa, and the generated
event_summary / observation / session_summary, which are not read}. `conversation` holds speaker_a and
speaker_b (the two names), `session_<k>` (a list of turns, k = 1, 2, ... in time order; a session may be
absent or empty) and `session_<k>_date_time` (its date, e.g. "1:56 pm on 8 May, 2023"). A turn:
{speaker, dia_id ("D<k>:<i>"), text} and, when it shared an image, img_url, blip_caption (the image's
generated caption) and query. A QA item: {question, answer (a string or a number), evidence (dia_ids),
category (1-5)}; category 5 (adversarial) items hold `adversarial_answer` (the plausible wrong answer the
question baits) and usually no `answer`.

Categories (the number in the file -> its name; the file's numbering is not the order the paper lists them
in: the published evaluation code scores 2, 3, 4 with plain F1, 1 by comma-separated sub-answers and 5 by
an abstention phrase; its per-category table prints 4, 1, 2, 3, 5 in the paper's order, and the counts of
locomo10.json, 282 / 321 / 96 / 841 / 446, match the paper's per-type counts): 1 multi-hop, 2 temporal,
3 open-domain, 4 single-hop, 5 adversarial.

Task: the context is the whole conversation, every session in order under a header with its number and
date, each turn "<speaker>: <text>" (an image turn adds "[shares an image: <caption>]"), sessions
separated by blank lines; all questions of a conversation share it. question = the item's question;
answers = [str(answer)], or for category 5 [NOT_MENTIONED] (what its official score accepts); task id
"<sample_id>_q<i>" (i = the item's index in `qa`). meta: dataset "locomo", category (the number),
question_type (its name), evidence, sample_id, speakers, sessions (how many), metric "locomo_f1" (the
official QA score, memrl.rewards.locomo) and, for category 5, adversarial_answer.
"""

from __future__ import annotations

import os
import re
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, parse_records, require
from memrl.types import Task

CATEGORIES: dict[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
"""LoCoMo's QA category numbers (as in locomo10.json) and their names."""
ADVERSARIAL = 5
NOT_MENTIONED = "not mentioned"
"""The gold answer of an adversarial question: the official score counts a prediction right when it says
the information is not mentioned (or not available)."""
METRIC = "locomo_f1"
_SESSION = re.compile(r"session_(\d+)")


def render_turn(turn: Any, where: str) -> str:
    """One turn as a line: "<speaker>: <text>", plus the shared image's caption when there is one."""
    speaker = require(turn, "speaker", str, where)
    text = require(turn, "text", str, where)
    line = f"{speaker}: {text}"
    caption = turn.get("blip_caption")
    if isinstance(caption, str) and caption.strip():
        line += f" [shares an image: {caption.strip()}]"
    return line


def render_conversation(conv: Any, where: str) -> tuple[str, int]:
    """(the context, the number of sessions with turns) of a `conversation` object."""
    if not isinstance(conv, dict):
        raise DataError(f"{where}: field 'conversation' must be an object, got {type(conv).__name__}")
    numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION.fullmatch(str(k))))
    a, b = conv.get("speaker_a"), conv.get("speaker_b")
    parts = [f"A conversation between {a} and {b}."] if isinstance(a, str) and isinstance(b, str) else []
    sessions = 0
    for k in numbers:
        turns = conv[f"session_{k}"]
        here = f"{where}: conversation.session_{k}"
        if not isinstance(turns, list):
            raise DataError(f"{here} must be a list of turns, got {type(turns).__name__}")
        if not turns:
            continue
        date = conv.get(f"session_{k}_date_time")
        if not isinstance(date, str) or not date.strip():
            raise DataError(f"{where}: conversation.session_{k}_date_time (the session's date) is missing or "
                            "not a string")
        lines = [f"[Session {k}, {date.strip()}]"]
        lines += [render_turn(t, f"{here}[{i}]") for i, t in enumerate(turns)]
        parts.append("\n".join(lines))
        sessions += 1
    if not sessions:
        raise DataError(f"{where}: field 'conversation' has no session with turns (session_1, session_2, ...)")
    return "\n\n".join(parts), sessions


def _answer(item: dict[str, Any], category: int, where: str) -> str:
    if category == ADVERSARIAL:
        return NOT_MENTIONED
    ans = item.get("answer")
    if isinstance(ans, bool) or not isinstance(ans, str | int | float):
        raise DataError(f"{where}: field 'answer' must be a string or a number, got {type(ans).__name__}")
    return str(ans)


def parse_locomo_record(rec: Any, where: str) -> list[Task]:
    """The tasks of one conversation (module docstring)."""
    conv = require(rec, "conversation", dict, where)
    items = require(rec, "qa", list, where)
    context, sessions = render_conversation(conv, where)
    sid = rec.get("sample_id")
    sample_id = str(sid) if isinstance(sid, str | int) and not isinstance(sid, bool) and str(sid) else \
        f"conv{where.rsplit(' ', 1)[-1]}"
    speakers = [s for s in (conv.get("speaker_a"), conv.get("speaker_b")) if isinstance(s, str)]
    tasks = []
    for i, item in enumerate(items):
        here = f"{where}: qa[{i}]"
        question = require(item, "question", str, here)
        category = item.get("category")
        if isinstance(category, bool) or category not in CATEGORIES:
            raise DataError(f"{here}: field 'category' must be one of 1-5 (LoCoMo's QA categories), got "
                            f"{category!r}")
        evidence = item.get("evidence", [])
        meta: dict[str, Any] = {
            "dataset": "locomo", "layout": "locomo", "category": category, "question_type": CATEGORIES[category],
            "evidence": list(evidence) if isinstance(evidence, list) else [], "sample_id": sample_id,
            "speakers": speakers, "sessions": sessions, "metric": METRIC,
        }
        if category == ADVERSARIAL:
            adv = item.get("adversarial_answer")
            if isinstance(adv, str | int | float) and not isinstance(adv, bool):
                meta["adversarial_answer"] = str(adv)
        tasks.append(Task(task_id=f"{sample_id}_q{i}", question=question, context=context,
                          answers=[_answer(item, category, here)], meta=meta))
    return tasks


def load_locomo(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from a LoCoMo file (a list of conversations); with skip_bad a malformed conversation is skipped
    whole."""
    return parse_records(path, parse_locomo_record, skip_bad=skip_bad, limit=limit, stats=stats)
