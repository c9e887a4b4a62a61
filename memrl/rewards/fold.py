"""The fold workflow's score: the outcome and each branch's scope verdict (FoldGRPO's out-of-scope reward,
arXiv 2510.11967 section 2.3.2), by an LLM judge (memrl's judge client) or by a rule. The token-level
process rewards that use them live with the estimator (memrl.algorithms.fold).
"""

from __future__ import annotations

import re
from typing import Any

from memrl.rewards.judge import JudgeClient, JudgeSettings
from memrl.rewards.multiq import multiq_reward
from memrl.types import Score, Task, Trajectory

SCOPE_RUBRIC = """A worker was given a sub-task and reported back. Decide whether the worker stayed within the sub-task.

Sub-task: {question}
Short name of the sub-task: {gold}
The worker's report: {prediction}

Reply CORRECT if the report only covers the sub-task, INCORRECT if it covers work beyond it, PARTIAL if unsure."""
"""memrl's scope rubric (the correct tag = in scope; partial = no verdict)."""

# ---- the fold workflow's score: outcome + branch scope verdicts ----

_WORD = re.compile(r"\w+")


def rule_scope(branch: dict[str, Any]) -> int:
    """scope_rule=queries: +1 when every search query of the branch shares a word with its description
    (case-insensitive; a branch without queries is in scope), else -1."""
    words = {w.lower() for w in _WORD.findall(branch.get("description") or "")}
    for q in branch.get("queries", ()):
        if not words & {w.lower() for w in _WORD.findall(q)}:
            return -1
    return 1


async def _judged_scope(branches: list[dict[str, Any]], settings: dict[str, Any], services: Any,
                        unjudged: str = "none") -> tuple[list[int], int]:
    js = JudgeSettings(**settings)
    own = services is None or js.rubric_file is None
    client = JudgeClient(js) if own else services.judge(js)
    if js.rubric_file is None:
        client.rubric = SCOPE_RUBRIC
    verdicts, errors = [], 0
    try:
        for b in branches:
            if b.get("returned") is None:
                verdicts.append(0)
                continue
            res = await client.judge(b["prompt"], [b["description"]], b["returned"])
            errors += int(res.error is not None)
            if res.error is not None and unjudged == "out":
                verdicts.append(-1)  # scope_unjudged=out (published judge_scope: no tag read = -1)
            else:
                verdicts.append({"correct": 1, "incorrect": -1}.get(res.verdict, 0))
    finally:
        if own:
            await client.close()
    return verdicts, errors


def fold_score(task: Task, traj: Trajectory, services: Any = None) -> Score | Any:
    """The fold workflow's reward: the rule outcome (memrl.rewards.multiq) and info["branch_scope"] (one
    verdict per branch: +1 in scope, -1 out, 0 none), by the trajectory's scope judge when it has one (an
    awaitable Score), else by its scope rule."""
    outcome = multiq_reward(task, traj)
    branches = list(traj.info.get("branches") or [])
    settings = traj.info.get("scope_judge")
    if settings and settings.get("url") and branches:
        return _scored(outcome, branches, settings, services, str(traj.info.get("scope_unjudged", "none")))
    rule = traj.info.get("scope_rule", "queries")
    verdicts = [rule_scope(b) if rule == "queries" else 0 for b in branches]
    return _score(outcome, verdicts, 0)


async def _scored(outcome: float, branches: list[dict[str, Any]], settings: dict[str, Any], services: Any,
                  unjudged: str = "none") -> Score:
    verdicts, errors = await _judged_scope(branches, settings, services, unjudged)
    return _score(outcome, verdicts, errors)


def _score(outcome: float, verdicts: list[int], errors: int) -> Score:
    return Score(outcome, metrics={"scope_in": float(sum(v > 0 for v in verdicts)),
                                   "scope_out": float(sum(v < 0 for v in verdicts)),
                                   "scope_judge_error": float(errors)},
                 info={"branch_scope": verdicts})


