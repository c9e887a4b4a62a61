"""FoldGRPO (memrl.algorithms.fold): every process reward and the estimator against hand-computed values, the
token-level advantages through compute_group_advantages and packing, and the fold score's scope verdicts."""

from __future__ import annotations

import asyncio
import math

import pytest

from memrl.algorithms.advantages import compute_group_advantages
from memrl.algorithms.fold import foldgrpo_estimator
from memrl.algorithms.options import FoldGRPOOptions
from memrl.algorithms.process_rewards import PROCESS_REWARDS, process_rewards
from memrl.algorithms.registry import get_advantage
from memrl.config import ConfigError, section_from_dict
from memrl.rewards.fold import fold_score, rule_scope
from memrl.training.update.packing import collate
from memrl.types import Group, Segment, Task, Trajectory

OPTS = FoldGRPOOptions()
DEFAULT = OPTS.process_rewards  # unfolded, scope, failure


def row(kind: str, spans: list[list[int]], n: int, **info) -> Segment:
    """A row of n response tokens, mask 1 on the spans' tokens."""
    mask = [0] * n
    for _t, a, b in spans:
        for i in range(a, b):
            mask[i] = 1
    return Segment([1], list(range(10, 10 + n)), [-0.5] * n, mask,
                   info={"kind": kind, "turns": [s[0] for s in spans], "turn_spans": spans, **info})


def traj(tid: str, reward: float, segs: list[Segment], final: int = 400, head: int = 100, budget: int = 1000,
         branches: int = 1, scope: list[int] | None = None, stop: str = "answer") -> Trajectory:
    t = Trajectory("t", tid, segs, reward=reward, metrics={"final_context_tokens": float(final)},
                   info={"main_head_tokens": head, "context_budget": budget, "stop": stop,
                         "branches": [{}] * branches, "branch_scope": scope or []})
    return t


# main row: turn 0 opened a branch (tokens 0-1), turn 3 searched (3-4), turn 4 answered (6-7)
MAIN_SPANS = [[0, 0, 2], [3, 3, 5], [4, 6, 8]]
# branch row: turns 1 (0-1) and 2, the return turn (3-4)
BRANCH_SPANS = [[1, 0, 2], [2, 3, 5]]


def test_unfolded_penalty_by_hand():
    seg = row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[])
    # unfolded = 700 - 100 = 600 > 0.5 * 1000: -1 on turn 3 only (turn 0 opened a branch, turn 4 answered)
    t = traj("a", 1.0, [seg], final=700)
    assert PROCESS_REWARDS["unfolded"](t, seg, OPTS) == [0, 0, 0, -1, -1, 0, 0, 0]
    # 600 - 100 = 500 is not beyond 500: nothing
    assert PROCESS_REWARDS["unfolded"](traj("a", 1.0, [seg], final=600), seg, OPTS) == [0.0] * 8
    # a trajectory that ran out instead of answering: its last main turn is not spared
    t = traj("a", 0.0, [seg], final=700, stop="context_budget")
    assert PROCESS_REWARDS["unfolded"](t, seg, OPTS) == [0, 0, 0, -1, -1, 0, -1, -1]
    # never on a branch row
    b = row("branch", BRANCH_SPANS, 5, thread=0)
    assert PROCESS_REWARDS["unfolded"](traj("a", 1.0, [b, seg], final=700), b, OPTS) == [0.0] * 5


def test_scope_failure_and_no_branch_terms_by_hand():
    b = row("branch", BRANCH_SPANS, 5, thread=0, error_turns=[2])
    # out of scope (-1): -0.2 on every branch turn but the last (the return turn)
    assert PROCESS_REWARDS["scope"](traj("a", 1.0, [b], scope=[-1]), b, OPTS) == [-0.2, -0.2, 0, 0, 0]
    assert PROCESS_REWARDS["scope"](traj("a", 1.0, [b], scope=[1]), b, OPTS) == [0.2, 0.2, 0, 0, 0]
    assert PROCESS_REWARDS["scope"](traj("a", 1.0, [b], scope=[0]), b, OPTS) == [0.0] * 5
    # failure: -1 on the error turn 2
    assert PROCESS_REWARDS["failure"](traj("a", 1.0, [b]), b, OPTS) == [0, 0, 0, -1, -1]
    # summed: -0.2 on turn 1, -1 on turn 2
    assert process_rewards(traj("a", 1.0, [b], scope=[-1]), b, ["scope", "failure"], OPTS) == [
        -0.2, -0.2, 0, -1, -1]
    m = row("main", MAIN_SPANS, 8, branch_turns=[], error_turns=[])
    assert PROCESS_REWARDS["no_branch"](traj("a", 1.0, [m], branches=0), m, OPTS) == [-1, -1, 0, -1, -1, 0, -1, -1]
    assert PROCESS_REWARDS["no_branch"](traj("a", 1.0, [m], branches=1), m, OPTS) == [0.0] * 8
    with pytest.raises(KeyError, match="unknown process reward 'nope'"):
        process_rewards(traj("a", 1.0, [b]), b, ["nope"], OPTS)


def test_foldgrpo_estimator_by_hand():
    a_main = row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[])
    a_branch = row("branch", BRANCH_SPANS, 5, thread=0, error_turns=[])
    b_main = row("main", [[0, 0, 2], [5, 3, 5]], 5, branch_turns=[], error_turns=[5])
    c_branch = row("branch", BRANCH_SPANS, 5, thread=0, error_turns=[])
    c_main = row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[])
    group = Group("t", [traj("a", 1.0, [a_branch, a_main], final=700, scope=[-1]),
                        traj("b", 1.0, [b_main], final=400),
                        traj("c", 0.0, [c_branch, c_main], final=400, scope=[1])])
    (per_group,) = foldgrpo_estimator([group], DEFAULT)
    # R = 1, 1, 0: mean 2/3, unbiased std sqrt(((1/3)^2 + (1/3)^2 + (2/3)^2) / 2) = sqrt(1/3)
    mean, std = 2 / 3, math.sqrt(1 / 3) + 1e-6
    hi, lo = (1 - mean) / std, (0 - mean) / std  # clip(1 + 0) and clip(R + Q) <= 0
    branch_out = (0.8 - mean) / std  # clip(1 - 0.2) = 0.8
    a_b, a_m = per_group[0]
    assert a_b == pytest.approx([branch_out, branch_out, hi, hi, hi])
    assert a_m == pytest.approx([hi, hi, hi, lo, lo, hi, hi, hi])  # turn 3 penalised (600 > 500)
    (b_m,) = per_group[1]
    assert b_m == pytest.approx([hi, hi, hi, lo, lo])  # the error turn 5 at tokens 3-4
    c_b, c_m = per_group[2]
    c_in = (0.2 - mean) / std  # a failed trajectory's in-scope branch: clip(0 + 0.2) = 0.2
    assert c_b == pytest.approx([c_in, c_in, lo, lo, lo]) and c_m == pytest.approx([lo] * 8)
    # no process rewards: GRPO with std division, every token the trajectory's value
    (plain,) = foldgrpo_estimator([group], process_rewards=[])
    assert plain[0][1] == pytest.approx([hi] * 8) and plain[2][0] == pytest.approx([lo] * 5)


def test_foldgrpo_agreeing_rewards_excluded_trajectories_and_groups_of_one():
    seg = row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[])
    seg2 = row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[])
    # R = 1, 1: std 0, so no division (memrl's guard): the penalised tokens get clip(0) - 1 = -1, others 0
    group = Group("t", [traj("a", 1.0, [seg], final=700), traj("b", 1.0, [seg2])])
    (per_group,) = foldgrpo_estimator([group], DEFAULT)
    assert per_group[0][0] == [0, 0, 0, -1, -1, 0, 0, 0] and per_group[1][0] == [0.0] * 8
    # an excluded (overlong-masked) trajectory: zeros, and out of the statistics (the rest: R = 1, 0)
    s = [row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[]) for _ in range(3)]
    ex = traj("x", 0.0, [s[2]])
    ex.info["exclude_from_group"] = True
    (per_group,) = foldgrpo_estimator([Group("t", [traj("a", 1.0, [s[0]]), traj("b", 0.0, [s[1]]), ex])], DEFAULT)
    std = math.sqrt(0.5) + 1e-6  # R = 1, 0: mean 1/2, unbiased std sqrt(1/2)
    assert per_group[0][0] == pytest.approx([0.5 / std] * 8) and per_group[2][0] == [0.0] * 8
    # a group of one: A = clip(R + Q)
    one = Group("t", [traj("a", 1.0, [row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[])], final=700)])
    (per_group,) = foldgrpo_estimator([one], DEFAULT)
    assert per_group[0][0] == [1, 1, 1, 0, 0, 1, 1, 1]


def test_token_advantages_written_and_packed():
    assert get_advantage("foldgrpo") is foldgrpo_estimator
    seg = row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[])
    seg2 = row("main", MAIN_SPANS, 8, branch_turns=[0], error_turns=[])
    group = Group("t", [traj("a", 1.0, [seg], final=700), traj("b", 1.0, [seg2])])
    compute_group_advantages([group], "foldgrpo", FoldGRPOOptions())
    assert seg.token_advantages == [0, 0, 0, -1, -1, 0, 0, 0]
    # advantage = mean over the 6 trained tokens (0, 1, 3, 4, 6, 7): (-1 - 1) / 6
    assert seg.advantage == pytest.approx(-2 / 6)
    assert seg2.token_advantages == [0.0] * 8 and seg2.advantage == 0.0
    mb = collate([seg], [1.0])
    # response token k sits at position len(prompt) - 1 + k = k (prompt of one id)
    assert mb.advantages[0, :8].tolist() == [0, 0, 0, -1, -1, 0, 0, 0]
    with pytest.raises(ValueError, match="token_advantages has 3 entries, response_ids has 8"):
        Segment([1], list(range(8)), [-0.5] * 8, token_advantages=[0.0] * 3)


def test_options_name_the_field():
    with pytest.raises(ConfigError, match="algorithm.foldgrpo.unfolded_fraction"):
        section_from_dict(FoldGRPOOptions, {"unfolded_fraction": 1.5}, "algorithm.foldgrpo")
    with pytest.raises((ConfigError, ValueError), match="process_rewards: unknown 'flat'"):
        section_from_dict(FoldGRPOOptions, {"process_rewards": ["flat"]}, "algorithm.foldgrpo")


def test_fold_score_rule_and_judge():
    t = Trajectory("t", "a", [], final_answer="Paris", info={
        "answer_text": "FINAL_ANSWER: Paris", "scope_rule": "queries",
        "branches": [{"description": "France capital", "queries": ["capital of France"], "prompt": "p",
                      "returned": "Paris"},
                     {"description": "Germany", "queries": ["Germany", "Italy"], "prompt": "q", "returned": "x"},
                     {"description": "none", "queries": [], "prompt": "r", "returned": None}]})
    score = fold_score(Task("t", "Q", "", ["Paris"]), t)
    assert score.reward == 1.0 and score.info["branch_scope"] == [1, -1, 1]
    assert rule_scope({"description": "a b", "queries": ["B c"]}) == 1
    t.info["scope_rule"] = "none"
    assert fold_score(Task("t", "Q", "", ["Paris"]), t).info["branch_scope"] == [0, 0, 0]

    from doubles import JsonServer

    replies = iter(["CORRECT", "INCORRECT"])
    server = JsonServer(lambda body: {"choices": [{"message": {"content": next(replies)}}]})
    try:
        t.info["scope_judge"] = {"url": server.url, "model": "m", "retries": 0}
        score = asyncio.run(fold_score(Task("t", "Q", "", ["Paris"]), t))
    finally:
        server.stop()
    # the third branch never returned: no verdict, not sent
    assert score.info["branch_scope"] == [1, -1, 0] and score.metrics["scope_judge_error"] == 0.0
