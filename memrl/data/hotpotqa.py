"""HotpotQA (and the shared multi-hop layout) to `Task`, in the original JSON layout and the HF layout.

Original: `{_id, question, answer, type, level, supporting_facts: [[title, sent_id]],
context: [[title, [sentence, ...]], ...]}`. HF (`hotpot_qa`): `id` instead of `_id`,
`context: {title: [...], sentences: [[...]]}`, `supporting_facts: {title: [...], sent_id: [...]}`.
Both give identical Tasks. `Task.context` renders the question's own paragraphs as
"Document i:\\n{title}\\n{text}" joined by blank lines; `Task.meta` keeps the paragraphs, the supporting
facts and the dataset's other fields so the long-context builder (memrl.data.longctx) can reuse them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import ReadStats, parse_records, require
from memrl.types import Task

HOTPOT_EXTRA_FIELDS = ("type", "level")


def paragraph_text(sentences: Sequence[str]) -> str:
    """A paragraph's text: its sentences concatenated as in the source (HotpotQA keeps leading spaces)."""
    return "".join(sentences)


def render_document(number: int, title: str, text: str) -> str:
    """One document as MemAgent / RULER-HQA render it (numbered from 1)."""
    return f"Document {number}:\n{title}\n{text}"


def render_paragraphs(paragraphs: Sequence[dict[str, Any]]) -> str:
    """A question's paragraphs as one context: numbered documents joined by blank lines."""
    return "\n\n".join(
        render_document(i + 1, p["title"], paragraph_text(p["sentences"])) for i, p in enumerate(paragraphs)
    )


def _parse_context(ctx: Any, where: str) -> list[dict[str, Any]]:
    """Paragraphs [{title, sentences}] from either layout of `context`."""
    if isinstance(ctx, dict):  # HF layout
        titles, sents = ctx.get("title"), ctx.get("sentences")
        if not isinstance(titles, list) or not isinstance(sents, list):
            raise DataError(f"{where}: field 'context' (HF layout) needs lists 'title' and 'sentences'")
        if len(titles) != len(sents):
            raise DataError(
                f"{where}: field 'context' has {len(titles)} titles but {len(sents)} sentence lists"
            )
        pairs = list(zip(titles, sents, strict=True))
    elif isinstance(ctx, list):
        pairs = []
        for j, item in enumerate(ctx):
            if not isinstance(item, list | tuple) or len(item) != 2:
                raise DataError(f"{where}: context[{j}] must be [title, [sentence, ...]]")
            pairs.append((item[0], item[1]))
    else:
        raise DataError(f"{where}: field 'context' must be a list of [title, sentences] or an HF dict")
    out = []
    for j, (title, sentences) in enumerate(pairs):
        if not isinstance(title, str):
            raise DataError(f"{where}: context[{j}] title must be a string, got {type(title).__name__}")
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise DataError(f"{where}: context[{j}] ({title!r}) sentences must be a list of strings")
        out.append({"title": title, "sentences": list(sentences)})
    return out


def _parse_supporting_facts(sf: Any, where: str) -> list[list[Any]]:
    """Supporting facts [[title, sent_id]] from either layout. Ids past a paragraph's end are kept."""
    if sf is None:
        return []
    if isinstance(sf, dict):
        titles, ids = sf.get("title"), sf.get("sent_id")
        if not isinstance(titles, list) or not isinstance(ids, list) or len(titles) != len(ids):
            raise DataError(f"{where}: field 'supporting_facts' (HF layout) needs equal-length 'title', 'sent_id'")
        pairs = list(zip(titles, ids, strict=True))
    elif isinstance(sf, list):
        pairs = []
        for j, item in enumerate(sf):
            if not isinstance(item, list | tuple) or len(item) != 2:
                raise DataError(f"{where}: supporting_facts[{j}] must be [title, sent_id]")
            pairs.append((item[0], item[1]))
    else:
        raise DataError(f"{where}: field 'supporting_facts' must be a list or an HF dict")
    out = []
    for j, (title, sid) in enumerate(pairs):
        if not isinstance(title, str) or isinstance(sid, bool) or not isinstance(sid, int):
            raise DataError(f"{where}: supporting_facts[{j}] must be [str title, int sent_id], got {[title, sid]!r}")
        out.append([title, int(sid)])
    return out


def parse_multihop_record(
    rec: Any, where: str, dataset: str, extra_fields: Sequence[str], list_fields: Sequence[str] = ()
) -> Task:
    """One HotpotQA-style record (either layout) to a Task; `extra_fields` are copied into meta as-is."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object (dict), got {type(rec).__name__}")
    if "_id" in rec:
        tid = rec["_id"]
    elif "id" in rec:
        tid = rec["id"]
    else:
        raise DataError(f"{where}: missing field '_id' (or 'id' in the HF layout)")
    if not isinstance(tid, str) or not tid:
        raise DataError(f"{where}: field '_id' must be a non-empty string, got {tid!r}")
    question = require(rec, "question", str, where)
    answer = require(rec, "answer", (str, list), where)
    answers = [answer] if isinstance(answer, str) else answer
    if not answers or not all(isinstance(a, str) for a in answers):
        raise DataError(f"{where}: field 'answer' must be a string or a non-empty list of strings")
    paragraphs = _parse_context(require(rec, "context", (list, dict), where), where)
    facts = _parse_supporting_facts(rec.get("supporting_facts"), where)
    meta: dict[str, Any] = {"dataset": dataset}
    for name in extra_fields:
        if name in rec:
            val = rec[name]
            # parquet/HF give nested lists back as lists; tuples from other sources become lists too
            meta[name] = _listify(val) if name in list_fields else val
    meta["paragraphs"] = paragraphs
    meta["supporting_facts"] = facts
    return Task(task_id=tid, question=question, context=render_paragraphs(paragraphs), answers=list(answers),
                meta=meta)


def _listify(val: Any) -> Any:
    if isinstance(val, list | tuple):
        return [_listify(v) for v in val]
    if isinstance(val, dict):
        return {k: _listify(v) for k, v in val.items()}
    return val


def parse_hotpotqa_record(rec: Any, where: str) -> Task:
    return parse_multihop_record(rec, where, "hotpotqa", HOTPOT_EXTRA_FIELDS)


def load_hotpotqa(
    path: str | os.PathLike[str], skip_bad: bool = False, limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """HotpotQA tasks from a JSON / JSONL / parquet file in the original or the HF layout."""
    return parse_records(path, parse_hotpotqa_record, skip_bad=skip_bad, limit=limit, stats=stats)


def gold_titles(task: Task) -> list[str]:
    """Titles named by the supporting facts, in first-mention order."""
    seen: dict[str, None] = {}
    for title, _ in task.meta.get("supporting_facts", []):
        seen.setdefault(title, None)
    return list(seen)


def gold_paragraph_indices(task: Task) -> list[int]:
    """Indices into meta['paragraphs'] of the supporting-fact paragraphs (titles not present are ignored)."""
    titles = set(gold_titles(task))
    return [i for i, p in enumerate(task.meta.get("paragraphs", [])) if p["title"] in titles]


def to_original_record(task: Task, extra_fields: Sequence[str] = HOTPOT_EXTRA_FIELDS) -> dict[str, Any]:
    """A Task made by this module back in the original JSON layout."""
    rec: dict[str, Any] = {"_id": task.task_id, "question": task.question,
                           "answer": task.answers[0] if len(task.answers) == 1 else list(task.answers)}
    for name in extra_fields:
        if name in task.meta:
            rec[name] = task.meta[name]
    rec["supporting_facts"] = [list(f) for f in task.meta.get("supporting_facts", [])]
    rec["context"] = [[p["title"], list(p["sentences"])] for p in task.meta.get("paragraphs", [])]
    return rec


def to_hf_record(task: Task, extra_fields: Sequence[str] = HOTPOT_EXTRA_FIELDS) -> dict[str, Any]:
    """A Task made by this module in the HF layout (`id`, dict-of-lists context and supporting facts)."""
    rec: dict[str, Any] = {"id": task.task_id, "question": task.question,
                           "answer": task.answers[0] if len(task.answers) == 1 else list(task.answers)}
    for name in extra_fields:
        if name in task.meta:
            rec[name] = task.meta[name]
    facts = task.meta.get("supporting_facts", [])
    rec["supporting_facts"] = {"title": [f[0] for f in facts], "sent_id": [int(f[1]) for f in facts]}
    paras = task.meta.get("paragraphs", [])
    rec["context"] = {"title": [p["title"] for p in paras], "sentences": [list(p["sentences"]) for p in paras]}
    return rec
