"""Which loader fits a data file: the kinds memrl.data.io reads and their detection from a file's first record."""

from __future__ import annotations

import os
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import first_record

KINDS = ("hotpotqa", "2wiki", "eval", "eval_index", "memagent", "multiobjective", "mem1", "tasks", "slime", "ruler",
         "longbench", "locomo", "longmemeval")
KIND_NAMES = {
    "hotpotqa": "HotpotQA (original or HF layout)",
    "2wiki": "2WikiMultihopQA (original or HF layout)",
    "eval": "MemAgent / ReMemR1 eval_{N}.json rows (context, input, answers)",
    "eval_index": "MemAgent index-only eval rows (context = document indices, rebuilt from docs_from)",
    "memagent": "MemAgent / verl training parquet rows (prompt, context, reward_model, extra_info)",
    "multiobjective": "MemAct multi-question rows",
    "mem1": "MEM1 multi-objective rows (prompt, reward_model.ground_truth.target: one alias list per objective)",
    "tasks": "memrl Task rows (task_id, question, context, answers, meta)",
    "slime": "vime / slime JSONL rows (prompt, label, metadata.context)",
    "ruler": "RULER rows (input, outputs; RULER's or MemAgent's layout)",
    "longbench": "LongBench / LongBench-E rows (input, context, answers, length, dataset, all_classes, _id)",
    "locomo": "LoCoMo conversations (sample_id, conversation: speakers and dated sessions, qa: question, answer, "
              "category)",
    "longmemeval": "LongMemEval questions (question_id, question_type, question, answer, question_date, haystack_sessions)",
}


def is_index_list(val: Any) -> bool:
    """Whether a `context` value is a list of document indices (not text): an index-only eval file
    (memrl.data.index_only)."""
    return isinstance(val, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in val)


def detect_kind(path: str | os.PathLike[str]) -> str:
    """Which loader fits a file, from the fields of its first record: one of KINDS."""
    rec = first_record(path)
    if isinstance(rec, dict):
        keys = set(rec)
        if {"task_id", "question", "answers"} <= keys:
            return "tasks"
        if {"data_source", "reward_model"} <= keys:
            extra = rec.get("extra_info")
            if "agent_name" in keys or (isinstance(extra, dict) and "sub_questions" in extra):
                return "multiobjective"
            rm = rec.get("reward_model")
            gt = rm.get("ground_truth") if isinstance(rm, dict) else None
            if isinstance(gt, dict) and isinstance(gt.get("target"), list):
                return "mem1"
            return "memagent"
        if {"conversation", "qa"} <= keys:
            return "locomo"
        if {"question_id", "question_type", "haystack_sessions"} <= keys:
            return "longmemeval"
        if {"input", "outputs"} <= keys:
            return "ruler"
        if {"input", "answers", "context", "length"} <= keys and ("all_classes" in keys or "_id" in keys):
            return "longbench"
        if {"input", "answers", "context"} <= keys:
            return "eval_index" if is_index_list(rec["context"]) else "eval"
        if {"prompt", "metadata"} <= keys:
            return "slime"
        if {"question", "answer", "context"} <= keys:
            return "2wiki" if ("evidences" in keys or "entity_ids" in keys) else "hotpotqa"
        raise DataError(f"{path}: row 0 has fields {sorted(keys)}; cannot tell which dataset it is "
                        f"(pass the kind explicitly: {', '.join(KINDS)})")
    raise DataError(f"{path}: empty or not a list of objects; cannot tell which dataset it is")
