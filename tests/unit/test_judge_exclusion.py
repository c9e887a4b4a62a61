"""workflow.judge.on_failure=exclude: a trajectory whose judgement failed is marked
info["exclude_from_group"]; GRPO / DCPO leave it out of the group's statistics and give it advantage 0."""

from __future__ import annotations

import pytest

from memrl.algorithms.advantages import compute_group_advantages, dcpo_estimator, grpo_estimator
from memrl.types import Group, Segment, Trajectory


def traj(tid: str, reward: float, excluded: bool = False, n_segments: int = 1) -> Trajectory:
    segs = [Segment(prompt_ids=[1], response_ids=[2], response_logprobs=[-0.1], step=i) for i in range(n_segments)]
    return Trajectory("t", tid, segs, reward=reward, info={"exclude_from_group": True} if excluded else {})


def test_excluded_trajectory_is_left_out_of_the_group_statistics():
    # kept rewards [1, 0, 1]: mean 2/3, deviations [1/3, -2/3, 1/3], unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3,
    # std = 0.5773503 -> A = [0.5773503, -1.1547005, 0.5773503]; the excluded one (reward 0) gets 0 on both
    # of its segments. Without the exclusion the group [1, 0, 0, 1] would give +-0.8660254.
    g = Group("t", [traj("a", 1.0), traj("b", 0.0), traj("x", 0.0, excluded=True, n_segments=2), traj("c", 1.0)])
    for est in (lambda gs: grpo_estimator(gs, norm_by_std=True), dcpo_estimator):
        out = est([g])
        assert out[0][2] == [0.0, 0.0]
        assert [v[0] for i, v in enumerate(out[0]) if i != 2] == pytest.approx([0.5773503, -1.1547005, 0.5773503],
                                                                            rel=1e-5)
    compute_group_advantages([g], "dcpo")
    assert [s.advantage for s in g.trajectories[2].segments] == [0.0, 0.0]


def test_a_group_with_every_trajectory_excluded_gets_zero_advantages():
    g = Group("t", [traj("a", 0.0, excluded=True), traj("b", 0.0, excluded=True)])
    assert grpo_estimator([g]) == [[[0.0], [0.0]]]
