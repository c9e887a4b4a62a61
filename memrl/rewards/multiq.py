"""The multi-question answer format and its outcome reward, in one place for MemAct and the search family
(fold, summarize, sliding_window): `answer_format` (the instruction the prompt carries), the
`FINAL_ANSWER:` markers and `final_answer_text`, the rule reward (`multiq_reward`, MemAct's "fully
correct": 1.0 only when every sub-question is right) and `outcome_reward` (the rule, or the LLM judge's
verdict when `workflow.judge.url` is set: `judge_score`).

The prediction is the text after the last `FINAL_ANSWER:`, read as JSON: an object keyed by sub-question
number ("1", "q1", "answer_1", ... in numeric order; other keys in written order) or a list in question
order. A code fence or text around the JSON is cut away (counted: `answer_parse_fallback`); text that
holds no JSON at all answers a single-question task as is, and no question of a multi-question task
(`answer_unparsed`). Sub-question i is right when its answer exactly matches (after QA normalization,
memrl.rewards.qa) one of its aliases; F1 is reported too.

`require_final_answer=True` (`workflow.require_final_answer`) reads the reply as the published reward does
(MemAct's verl/utils/reward_score/mem_agent.py, extract_solution_str): the text after the last
"FINAL_ANSWER: " (colon and space), with "<|im_end|>" removed and stripped; a reply without that marker
answers nothing and scores 0 (`no_final_marker`). memrl's default (False) reads the whole reply when it
has no marker.

Task layout: `answers` = the primary answer of each sub-question in order, `meta["sub_questions"]` and
`meta["sub_answers"]` (a list of aliases per sub-question). Without meta, `answers` are the aliases of one
question.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from memrl.rewards.judge import ERROR_KINDS, JudgeClient, JudgeSettings
from memrl.rewards.qa import best_em, best_f1
from memrl.types import Score, Task, Trajectory

MARKER = "FINAL_ANSWER:"
PUBLISHED_MARKER = "FINAL_ANSWER: "
"""The published reward's marker: with the space (a reply writing "FINAL_ANSWER:" + newline has none)."""
_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```", re.DOTALL)
_NUM = re.compile(r"\d+")


@dataclass
class ParsedAnswer:
    """The answers read from a prediction, one per position (None = missing), and how they were read."""

    answers: list[str | None]
    fallback: bool
    unparsed: bool


def answer_format(task: Task) -> str:
    """The answer instruction: a JSON object keyed "1".."k" for k sub-questions, else a short answer."""
    subs = task.meta.get("sub_questions") or []
    if len(subs) > 1:
        keys = ", ".join(f'"{i}": "<answer {i}>"' for i in range(1, len(subs) + 1))
        return (f"Answer all {len(subs)} questions. End with one line: FINAL_ANSWER: {{{keys}}} "
                "(a JSON object; each answer a short phrase).")
    return "End with one line: FINAL_ANSWER: <short answer>."


def gold_aliases(task: Task) -> list[list[str]]:
    """Aliases per sub-question (one entry for a single-question task)."""
    subs = task.meta.get("sub_answers")
    if subs:
        return [[str(a) for a in (s if isinstance(s, list) else [s])] for s in subs]
    return [list(task.answers)]


def _as_text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    return json.dumps(v, ensure_ascii=False) if isinstance(v, dict) else str(v)


def _ordered(obj: dict[str, Any], k: int) -> list[Any]:
    """The values of a keyed answer by position. Keys numbering distinct sub-questions within 1..k ("1",
    "Q2", "answer_3") put each value at its number (a missing one stays None: {"Q1", "Q3"} answers 1 and 3,
    not 1 and 2); other numbered keys go in numeric order; keys without numbers in written order."""
    keys = list(obj)
    nums = [_NUM.search(str(key)) for key in keys]
    if all(nums):
        ns = [int(n.group()) for n in nums]  # type: ignore[union-attr]
        if len(set(ns)) == len(ns) and all(1 <= n <= k for n in ns):
            out: list[Any] = [None] * max(ns)
            for n, key in zip(ns, keys, strict=True):
                out[n - 1] = obj[key]
            return out
        return [obj[key] for _, key in sorted(zip(ns, keys, strict=True), key=lambda x: x[0])]
    return [obj[key] for key in keys]


def published_answer_text(text: str) -> str:
    """What the published reward reads of a reply: the text after the last "FINAL_ANSWER: ", "<|im_end|>"
    removed, stripped; "" when there is no such marker (mem_agent.py scores that 0 without judging)."""
    i = text.rfind(PUBLISHED_MARKER)
    if i < 0:
        return ""
    return text[i + len(PUBLISHED_MARKER):].replace("<|im_end|>", "").strip()


def final_answer_text(text: str, require_final_answer: bool = False) -> str:
    """The text after the last FINAL_ANSWER: marker ("" when there is none); with require_final_answer,
    what the published reward reads (published_answer_text)."""
    if require_final_answer:
        return published_answer_text(text)
    i = text.rfind(MARKER)
    return text[i + len(MARKER):].strip() if i >= 0 else ""


def _json_value(text: str) -> tuple[Any, bool] | None:
    """(value, needed_cleaning) of the first JSON object/list in text, or None."""
    t = text.strip()
    try:
        v = json.loads(t)
        if isinstance(v, dict | list):
            return v, False
    except json.JSONDecodeError:
        pass
    m = _FENCE.search(t)
    if m:
        t = m.group(1)
    starts = [i for i in (t.find("{"), t.find("[")) if i >= 0]
    for s in sorted(starts):
        try:
            v, _ = json.JSONDecoder().raw_decode(t, s)
            return v, True
        except json.JSONDecodeError:
            continue
    return None


def parse_prediction(text: str, k: int, require_final_answer: bool = False) -> ParsedAnswer:
    """k answers from the text after the last FINAL_ANSWER: (or the whole text when there is no marker);
    with require_final_answer, from `published_answer_text` (no marker: nothing answered)."""
    if require_final_answer:
        if PUBLISHED_MARKER not in text:
            return ParsedAnswer([None] * k, False, False)
        body = published_answer_text(text)
    else:
        i = text.rfind(MARKER)
        body = text[i + len(MARKER):] if i >= 0 else text
    got = _json_value(body)
    if got is None:
        plain = body.strip()
        if k == 1 and plain:
            return ParsedAnswer([plain.splitlines()[0].strip()], False, False)
        return ParsedAnswer([None] * k, False, True)
    value, cleaned = got
    items = _ordered(value, k) if isinstance(value, dict) else list(value)
    if k == 1 and len(items) != 1:
        items = [value]  # a single question answered with a structure: score its text
    answers = [_as_text(items[j]) if j < len(items) else None for j in range(k)]
    return ParsedAnswer(answers, cleaned, False)


def score(text: str, task: Task, require_final_answer: bool = False) -> dict[str, Any]:
    """Per-sub-question EM / F1 and the all-correct reward for one prediction text."""
    golds = gold_aliases(task)
    parsed = parse_prediction(text, len(golds), require_final_answer)
    ems, f1s = [], []
    for pred, aliases in zip(parsed.answers, golds, strict=True):
        ems.append(best_em(pred, aliases) if pred is not None else 0.0)
        f1s.append(best_f1(pred, aliases) if pred is not None else 0.0)
    k = len(golds)
    return {
        "reward": 1.0 if all(e == 1.0 for e in ems) else 0.0,
        "answers": parsed.answers,
        "em": ems,
        "f1": f1s,
        "metrics": {
            "multiq_questions": float(k),
            "multiq_correct": float(sum(ems)),
            "multiq_all_correct": 1.0 if all(e == 1.0 for e in ems) else 0.0,
            "multiq_subq_accuracy": sum(ems) / k,
            "multiq_f1_mean": sum(f1s) / k,
            "answer_parse_fallback": float(parsed.fallback),
            "answer_unparsed": float(parsed.unparsed),
            "no_final_marker": float((PUBLISHED_MARKER if require_final_answer else MARKER) not in text),
        },
    }


def multiq_reward(task: Task, traj: Trajectory) -> float:
    """Score traj.info["answer_text"] (under traj.info["require_final_answer"], set by the workflow from
    `workflow.require_final_answer`); writes the metrics onto traj.metrics and the details to traj.info."""
    s = score(traj.info.get("answer_text", traj.final_answer or ""), task,
              bool(traj.info.get("require_final_answer", False)))
    traj.metrics.update(s["metrics"])
    traj.info["multiq"] = {"answers": s["answers"], "em": s["em"], "f1": s["f1"]}
    return s["reward"]


async def judge_score(task: Task, traj: Trajectory, on_failure: str, client: Any) -> Score:
    """The judge's verdict on the final answer as a Score: reward = its score (1.0 only when CORRECT),
    info["judge"] = {score, verdict, error}, metrics judge_correct / judge_error / judge_error_<kind> /
    judge_excluded. A failed call scores 0 and is counted (memrl.rewards.judge never raises); with
    judge.on_failure=exclude it also sets info["exclude_from_group"]."""
    multi = len(task.meta.get("sub_questions", [])) > 1
    gold = [json.dumps(task.answers, ensure_ascii=False)] if multi else list(task.answers)
    if isinstance(task.meta.get("ground_truth"), str):  # a file row's ground truth, verbatim (Q-keyed JSON)
        gold = [task.meta["ground_truth"]]
    res = await client.judge(task.question, gold, traj.final_answer)
    excluded = res.error is not None and on_failure == "exclude"
    metrics = {"judge_error": float(res.error is not None),
               **{f"judge_error_{k}": float(res.error == k) for k in ERROR_KINDS},
               "judge_correct": float(res.verdict == "correct"), "judge_excluded": float(excluded)}
    info: dict[str, Any] = {"judge": {"score": res.score, "verdict": res.verdict, "error": res.error}}
    if excluded:
        info["exclude_from_group"] = True
    return Score(float(res.score), metrics=metrics, info=info)


def outcome_reward(task: Task, traj: Trajectory, services: Any = None) -> float | Awaitable[Score]:
    """Outcome reward: 1.0 only when every sub-question is answered right (multiq_reward; its
    metrics are written either way), a float; with `judge.url` (traj.info["judge_settings"], the config's
    JudgeSettings as a dict) instead an awaitable of the judge's verdict as a memrl.types.Score (with its
    metrics and info; a failed judgement scores 0), through the run's judge client (`services.judge`)."""
    rule = multiq_reward(task, traj)
    settings = traj.info.get("judge_settings")
    if not settings or not settings.get("url"):
        return rule
    return _judged(task, traj, settings, services)


async def _judged(task: Task, traj: Trajectory, settings: dict[str, Any], services: Any) -> Score:
    on_failure = str(settings.get("on_failure", "zero"))
    if services is not None:
        return await judge_score(task, traj, on_failure, services.judge(settings))

    client = JudgeClient(JudgeSettings(**settings))  # outside a run: its own client, closed here
    try:
        return await judge_score(task, traj, on_failure, client)
    finally:
        await client.close()


def row_columns(traj: Trajectory) -> dict[str, Any]:
    """A multi-question trajectory's own evaluation-row columns (WorkflowSpec.row_columns of the workflows this
    reward or its metrics score): all sub-questions right as em and sub_em, the mean sub-question F1 as f1, and
    the workflow's own count of generated tokens (a row of a tool-using agent also holds tool output); none for
    a trajectory without the multiq_* metrics."""
    tm = traj.metrics
    if "multiq_questions" not in tm:
        return {}
    return {"em": tm["multiq_all_correct"], "sub_em": tm["multiq_all_correct"], "f1": tm["multiq_f1_mean"],
            "generated_tokens": int(tm.get("generated_tokens", 0))}
