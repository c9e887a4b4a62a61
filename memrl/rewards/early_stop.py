"""InfMem's rewards (arXiv 2602.02704; UCMP13753/InfMem recurrent/impls/infmem.py and its reward manager
verl/workers/reward_manager/thread.py): the outcome, an early-stop reward and a protocol reward, mixed
as one trajectory reward

    R = w_out * outcome + w_stop * early_stop + w_call * calls_ok + w_mem * memories_ok

(published weights 0.6, 0.6, 0.5, 0.5). Pure functions over plain values; the infmem workflow's
`reward` reads them off a trajectory's segments.

Early stop: let s be the first memory step (0-based) whose memory holds a gold answer
(`answer_in_memory`) and t the step at which the planner said stop (it has written memories 0..t-1), or,
when it never stopped, the number of memory steps it wrote. With d = t - s the reward is
min(1, gamma^(d - 1)) (gamma = 0.6): 1 for stopping right after the answer arrived, x0.6 per extra step;
0 when no memory ever held the answer. The released code skips a trajectory that never stopped and
found the answer at step 0 (its "found" marker is the step number, and 0 reads as unset):
`first_step_rule="published"` reproduces that, "counted" (memrl) rewards it like any other step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

FIRST_STEP_RULES: tuple[str, ...] = ("counted", "published")
_SPACE = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text.strip()).lower()


def answer_in_memory(memory: str, golds: Sequence[str]) -> bool:
    """A gold answer, whitespace collapsed and lower-cased, occurs in the memory so normalized (the
    released code's check; an empty gold never counts)."""
    mem = _norm(memory)
    return any(_norm(g) and _norm(g) in mem for g in golds)


def first_answer_step(memories: Sequence[str], golds: Sequence[str]) -> int | None:
    """The index of the first memory holding a gold answer, None when none does."""
    return next((i for i, m in enumerate(memories) if answer_in_memory(m, golds)), None)


def early_stop_reward(found_step: int | None, end_step: int, stopped: bool, gamma: float = 0.6,
                      first_step_rule: str = "counted") -> float:
    """min(1, gamma^(end_step - found_step - 1)); 0 when the answer never reached the memory. `end_step`:
    the step the planner stopped at, or the memory steps written when it did not stop."""
    if first_step_rule not in FIRST_STEP_RULES:
        raise ValueError(f"first_step_rule must be one of {', '.join(FIRST_STEP_RULES)}, got {first_step_rule!r}")
    if found_step is None:
        return 0.0
    if not stopped and found_step == 0 and first_step_rule == "published":
        return 0.0
    return min(1.0, gamma ** (end_step - found_step - 1))


def mixed_reward(outcome: float, early_stop: float, calls_ok: bool, memories_ok: bool,
                 weights: tuple[float, float, float, float] = (0.6, 0.6, 0.5, 0.5)) -> float:
    """w_out * outcome + w_stop * early_stop + w_call * calls_ok + w_mem * memories_ok."""
    w_out, w_stop, w_call, w_mem = weights
    return w_out * outcome + w_stop * early_stop + w_call * float(calls_ok) + w_mem * float(memories_ok)
