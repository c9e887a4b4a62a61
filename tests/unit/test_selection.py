"""DAPO dynamic sampling (zero-variance group filter) and DCPO segment selection."""

from __future__ import annotations

import random

import pytest

from memrl.algorithms.selection import dcpo_select_segments, filter_zero_variance_groups
from memrl.types import DataModelError, Group, Segment, Trajectory


def traj(task: str, tid: str, reward: float | None, n_segments: int) -> Trajectory:
    segs = [
        Segment(prompt_ids=[1], response_ids=[2], response_logprobs=[-0.1], step=i) for i in range(n_segments)
    ]
    return Trajectory(task, tid, segs, reward=reward)


def group(task: str, rewards: list[float | None], sizes: list[int]) -> Group:
    return Group(
        task, [traj(task, f"{task}-{i}", r, n) for i, (r, n) in enumerate(zip(rewards, sizes, strict=True))]
    )


def test_filter_zero_variance_groups_over_trajectory_rewards():
    g1 = group("q1", [1.0, 0.0], [3, 1])  # differ -> kept (4 rows, 2 trajectories)
    g2 = group("q2", [1.0, 1.0, 1.0], [2, 5, 1])  # all agree -> dropped
    g3 = group("q3", [0.5], [4])  # a group of one -> kept (DAPO keeps it; its GRPO advantage is r)
    g4 = group("q4", [0.0, 0.0], [1, 1])  # all agree -> dropped
    g5 = group("q5", [0.0, 0.0, 1.0], [1, 6, 2])  # one differs -> kept
    kept, dropped = filter_zero_variance_groups([g1, g2, g3, g4, g5])
    assert [g.task_id for g in kept] == ["q1", "q3", "q5"]
    assert dropped == 2


def test_filter_ignores_row_counts():
    # trajectory rewards [1, 0]; row-wise the rewards would read [1, 1, 1, 1, 0] (mostly equal):
    # the decision uses one value per trajectory
    kept, dropped = filter_zero_variance_groups([group("q", [1.0, 0.0], [4, 1])])
    assert (len(kept), dropped) == (1, 0)


def test_filter_needs_rewards():
    with pytest.raises(DataModelError, match="has no reward yet"):
        filter_zero_variance_groups([group("q", [1.0, None], [1, 1])])


class FirstChoiceRng(random.Random):
    """An rng that never shuffles and always draws index 0, so the selection can be written by hand."""

    def shuffle(self, x, *args, **kwargs):
        return None

    def randrange(self, *args, **kwargs):
        return 0


def names(segments: list[Segment]) -> list[str]:
    return [f"{s.trajectory_id}:{s.step}" for s in segments]


def test_dcpo_select_hand_traced():
    g = group("q", [1.0, 0.0, 0.0], [1, 2, 4])  # 7 segments
    rng = FirstChoiceRng()
    # round 1: one per trajectory (q-0:0, q-1:0, q-2:0); round 2: q-0 has none left, so q-1:1, q-2:1
    assert names(dcpo_select_segments(g, 5, rng)) == ["q-0:0", "q-1:0", "q-2:0", "q-1:1", "q-2:1"]
    # with n = 2 < 3 trajectories, the first two trajectories of the (shuffled) order get one each
    assert names(dcpo_select_segments(g, 2, rng)) == ["q-0:0", "q-1:0"]
    # n = 9 > 7 segments: all 7 once, never repeated (round 3: q-2:2, round 4: q-2:3)
    assert names(dcpo_select_segments(g, 9, rng)) == [
        "q-0:0",
        "q-1:0",
        "q-2:0",
        "q-1:1",
        "q-2:1",
        "q-2:2",
        "q-2:3",
    ]
    # allow_repeats: after all 7 are used the round-robin goes on over every trajectory
    assert names(dcpo_select_segments(g, 9, rng, allow_repeats=True))[7:] == ["q-0:0", "q-1:0"]


def test_dcpo_select_properties_with_a_real_rng():
    g = group("q", [1.0, 0.0, 0.0, 1.0], [1, 2, 4, 3])  # 10 segments
    for n in range(0, 13):
        picked = dcpo_select_segments(g, n, random.Random(n))
        assert len(picked) == min(n, 10)
        assert len({id(s) for s in picked}) == len(picked)  # no repeats
        per_traj = {
            t.trajectory_id: sum(s.trajectory_id == t.trajectory_id for s in picked) for t in g.trajectories
        }
        if n >= 4:
            assert min(per_traj.values()) >= 1  # every trajectory is represented first
        else:
            assert max(per_traj.values()) <= 1
    # deterministic given the rng state
    assert dcpo_select_segments(g, 7, random.Random(3)) == dcpo_select_segments(g, 7, random.Random(3))


def test_dcpo_select_edge_cases():
    g = Group("q", [traj("q", "empty", 0.0, 0), traj("q", "one", 1.0, 1)])
    assert names(dcpo_select_segments(g, 3, random.Random(0))) == ["one:0"]  # empty trajectory skipped
    assert dcpo_select_segments(g, 0, random.Random(0)) == []
    with pytest.raises(ValueError, match="n must be >= 0"):
        dcpo_select_segments(g, -1, random.Random(0))


def test_trainer_dcpo_selection_metrics_and_shortfall():
    from memrl.training.trainer import dcpo_rng, dcpo_selection

    g1 = group("q1", [1.0, 0.0, 1.0], [1, 1, 3])
    g1.trajectories[1].metrics["prunes"] = 2  # one segment, but it pruned
    g2 = group("q2", [0.0, 1.0], [1, 1])  # 2 segments < n: both train, once each
    chosen, m = dcpo_selection([g1, g2], 3, dcpo_rng(5, 2))
    rng = dcpo_rng(5, 2)
    assert chosen == [dcpo_select_segments(g1, 3, rng), dcpo_select_segments(g2, 3, rng)]
    assert sorted(s.trajectory_id for s in chosen[0]) == ["q1-0", "q1-1", "q1-2"]  # one per trajectory
    assert sorted(s.trajectory_id for s in chosen[1]) == ["q2-0", "q2-1"]
    assert m == {"dcpo/segments_per_trajectory": 7 / 5, "dcpo/selected": 5.0, "dcpo/available": 7.0,
                 "dcpo/pruned_share": 2 / 5}
    assert dcpo_selection([g1, g2], 3, dcpo_rng(5, 2))[0] == chosen  # same seed and step, same selection
