"""DAPO dynamic sampling (zero-variance group filter) and DCPO segment selection (algorithm.selection)."""

from __future__ import annotations

import random

import pytest

from memrl.algorithms.selection import (
    filter_zero_variance_groups,
    published_segments,
    select_segments,
    spread_unused_segments,
)
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
    """An rng that never shuffles, samples the first k and always draws index 0: selections by hand."""

    def shuffle(self, x, *args, **kwargs):
        return None

    def sample(self, population, k, *args, **kwargs):
        return list(population)[:k]

    def randrange(self, *args, **kwargs):
        return 0


def names(segments: list[Segment]) -> list[str]:
    return [f"{s.trajectory_id}:{s.step}" for s in segments]


def rows_per_trajectory(g: Group, picked: list[Segment]) -> list[int]:
    return [sum(s.trajectory_id == t.trajectory_id for s in picked) for t in g.trajectories]


def test_spread_unused_hand_traced():
    g = group("q", [1.0, 0.0, 0.0], [1, 2, 4])  # 7 segments
    rng = FirstChoiceRng()
    # round 1: one per trajectory (q-0:0, q-1:0, q-2:0); round 2: q-0 has none left, so q-1:1, q-2:1
    assert names(spread_unused_segments(g, 5, rng)) == ["q-0:0", "q-1:0", "q-2:0", "q-1:1", "q-2:1"]
    # with n = 2 < 3 trajectories, the first two trajectories of the (shuffled) order get one each
    assert names(spread_unused_segments(g, 2, rng)) == ["q-0:0", "q-1:0"]
    # n = 9 > 7 segments: all 7 once, never repeated (round 3: q-2:2, round 4: q-2:3)
    assert names(spread_unused_segments(g, 9, rng)) == ["q-0:0", "q-1:0", "q-2:0", "q-1:1", "q-2:1", "q-2:2",
                                                        "q-2:3"]


def test_published_hand_traced():
    g = group("q", [1.0, 0.0, 0.0], [1, 2, 4])
    rng = FirstChoiceRng()  # cycle order = group order, every draw its first candidate
    # K = 3 < n = 5: one each (segment 0), then the cycle 0, 1: q-0 has no unused segment -> q-0:0 again;
    # q-1's unused are [1] -> q-1:1
    assert names(published_segments(g, 5, rng)) == ["q-0:0", "q-1:0", "q-2:0", "q-0:0", "q-1:1"]
    # K = 3 >= n = 2: a sample of 2 trajectories (here the first two), one segment each
    assert names(published_segments(g, 2, rng)) == ["q-0:0", "q-1:0"]
    # n = 9: 6 more slots cycle 0, 1, 2, 0, 1, 2 (a second pass). q-0 repeats twice; q-1 takes its unused
    # segment 1, then has none left and repeats segment 0; q-2 takes unused 1, then unused 2
    assert names(published_segments(g, 9, rng)) == ["q-0:0", "q-1:0", "q-2:0", "q-0:0", "q-1:1", "q-2:1",
                                                    "q-0:0", "q-1:0", "q-2:2"]


# The chosen segment-count profile (K = 8 trajectories, n = 12 rows, docs/concepts/memact.md): one trajectory that
# pruned nine times (10 segments) among seven that never pruned (1 segment each).
PROFILE = [10, 1, 1, 1, 1, 1, 1, 1]


def test_spread_unused_gives_the_extra_rows_to_the_pruning_trajectory():
    # By hand: round 1 gives each of the 8 one row (8); the 4 left go to the only trajectory with unused
    # segments, one per round (rounds 2-5): 5 rows for it, 1 for each of the others, for every rng.
    g = group("q", [0.0] * 8, PROFILE)
    for seed in range(50):
        picked = spread_unused_segments(g, 12, random.Random(seed))
        assert rows_per_trajectory(g, picked) == [5, 1, 1, 1, 1, 1, 1, 1]
        assert len({id(s) for s in picked}) == 12  # never a repeat
    # half of the trajectories pruned (3 segments), half did not: rounds 1-2 -> 2 rows each for the pruning half
    g2 = group("q", [0.0] * 8, [3, 3, 3, 3, 1, 1, 1, 1])
    assert rows_per_trajectory(g2, spread_unused_segments(g2, 12, random.Random(1))) == [2, 2, 2, 2, 1, 1, 1, 1]


def check_published_invariants(g: Group, picked: list[Segment], n: int) -> list[int]:
    """Exact per-draw invariants of the published rule with K = len(g.trajectories) <= n."""
    rows = rows_per_trajectory(g, picked)
    assert len(picked) == n and min(rows) >= 1
    for t in g.trajectories:
        mine = [s for s in picked if s.trajectory_id == t.trajectory_id]
        if len({id(s) for s in mine}) < len(mine):  # a repeat only when every segment of it is taken
            assert {id(s) for s in mine} == {id(s) for s in t.segments}
    return rows


def test_published_rows_per_trajectory_follow_the_hand_computed_distribution():
    # By hand (upstream AgentLoopManager._sampling_random with K = 8 < n = 12): one row per trajectory,
    # then n - K = 4 slots over one shuffled list of the 8 (a single pass, since 4 <= 8): the first 4 of a
    # uniform permutation. So rows_i = 1 + B_i with B_i ~ Bernoulli(4/8 = 1/2), sum B_i = 4 exactly,
    # E[rows_i] = 1.5 whatever its segment count. A single-segment trajectory's second row repeats its
    # segment; the 10-segment one's is another segment. Each of its 10 segments trains with probability
    # 1/10 (first row) + 1/2 * 9/10 * 1/9 (second row, uniform over the 9 unused) = 0.15.
    g = group("q", [0.0] * 8, PROFILE)
    draws = 2000
    two = [0] * 8
    seg_hits = [0] * 10
    for seed in range(draws):
        picked = published_segments(g, 12, random.Random(seed))
        rows = check_published_invariants(g, picked, 12)
        assert sorted(rows) == [1, 1, 1, 1, 2, 2, 2, 2]  # exactly 4 trajectories get a second row
        for i, r in enumerate(rows):
            two[i] += r == 2
        mine = {id(s) for s in picked if s.trajectory_id == "q-0"}
        for j, s in enumerate(g.trajectories[0].segments):
            seg_hits[j] += id(s) in mine
        if rows[0] == 2:
            assert len(mine) == 2  # the pruning trajectory's second row is a segment not taken yet
    # binomial tolerance: 5 standard deviations (sd = sqrt(draws * p * (1 - p)))
    sd_two = (draws * 0.5 * 0.5) ** 0.5  # 22.4
    assert all(abs(c - draws * 0.5) < 5 * sd_two for c in two), two
    sd_seg = (draws * 0.15 * 0.85) ** 0.5  # 16.0
    assert all(abs(c - draws * 0.15) < 5 * sd_seg for c in seg_hits), seg_hits
    # rows are 1 + Bernoulli(1/2): the pruning trajectory is not favoured (mean rows within 5 sd of 1.5)
    assert abs((draws + two[0]) / draws - 1.5) < 5 * sd_two / draws


def test_published_cycles_again_when_more_slots_than_trajectories_and_samples_when_fewer():
    # K = 3, n = 8: 5 slots cycle over a shuffled list of 3 (positions 0, 1, 2, 0, 1): two trajectories get
    # 2 more rows, one gets 1 more -> rows {3, 3, 2} in some order
    g = group("q", [0.0] * 3, [1, 1, 4])
    for seed in range(30):
        rows = check_published_invariants(g, published_segments(g, 8, random.Random(seed)), 8)
        assert sorted(rows) == [2, 3, 3]
    # K = 8 > n = 5 (the upstream assert n >= actual_n forbids it; memrl's validate does too): 5 distinct
    # trajectories, one random segment each
    g8 = group("q", [0.0] * 8, [2, 1, 3, 1, 1, 4, 1, 1])
    for seed in range(30):
        rows = rows_per_trajectory(g8, published_segments(g8, 5, random.Random(seed)))
        assert sorted(rows) == [0, 0, 0, 1, 1, 1, 1, 1]
    # K = n: every trajectory exactly once
    assert rows_per_trajectory(g8, published_segments(g8, 8, random.Random(0))) == [1] * 8


def test_published_invariants_on_a_mixed_profile():
    g = group("q", [0.0] * 8, [1, 2, 3, 5, 10, 1, 1, 2])
    for seed in range(300):
        rows = check_published_invariants(g, published_segments(g, 12, random.Random(seed)), 12)
        assert max(rows) == 2


def test_selection_edge_cases():
    g = Group("q", [traj("q", "empty", 0.0, 0), traj("q", "one", 1.0, 1)])
    for rule in (spread_unused_segments, published_segments):
        assert names(rule(g, 0, random.Random(0))) == []
        with pytest.raises(ValueError, match="n must be >= 0"):
            rule(g, -1, random.Random(0))
    assert names(spread_unused_segments(g, 3, random.Random(0))) == ["one:0"]  # empty trajectory skipped
    assert names(published_segments(g, 3, random.Random(0))) == ["one:0"] * 3  # repeated to n rows
    with pytest.raises(ValueError, match="unknown segment selection 'best'"):
        select_segments([g], "best", 3, random.Random(0))


def test_trainer_selection_metrics_and_shortfall():
    from memrl.training.trainer import segment_selection, selection_rng

    g1 = group("q1", [1.0, 0.0, 1.0], [1, 1, 3])
    g1.trajectories[1].metrics["prunes"] = 2  # one segment, but it pruned
    g2 = group("q2", [0.0, 1.0], [1, 1])  # 2 segments < 3: spread_unused trains both once
    chosen, m = segment_selection([g1, g2], "spread_unused", 3, selection_rng(5, 2))
    rng = selection_rng(5, 2)
    assert chosen == [spread_unused_segments(g1, 3, rng), spread_unused_segments(g2, 3, rng)]
    assert sorted(s.trajectory_id for s in chosen[0]) == ["q1-0", "q1-1", "q1-2"]  # one per trajectory
    assert sorted(s.trajectory_id for s in chosen[1]) == ["q2-0", "q2-1"]
    assert m == {"dcpo/segments_per_trajectory": 7 / 5, "dcpo/selected": 5.0, "dcpo/available": 7.0,
                 "dcpo/repeated": 0.0, "dcpo/pruned_share": 2 / 5}
    # published: g2 gets 3 rows from 2 single-segment trajectories, so one repeats
    chosen, m = segment_selection([g1, g2], "published", 3, selection_rng(5, 2))
    assert [len(c) for c in chosen] == [3, 3] and m["dcpo/repeated"] == 1.0 and m["dcpo/selected"] == 6.0


def test_selection_is_seeded_by_trainer_seed_and_step():
    from memrl.training.trainer import segment_selection, selection_rng

    groups = [group(f"q{k}", [0.0] * 8, [1, 2, 3, 5, 10, 1, 1, 2]) for k in range(4)]
    for rule in ("published", "spread_unused"):
        a = segment_selection(groups, rule, 12, selection_rng(7, 3))[0]
        # the same (seed, step) -- a resumed run at that step -- selects the same rows
        assert a == segment_selection(groups, rule, 12, selection_rng(7, 3))[0]
        assert a != segment_selection(groups, rule, 12, selection_rng(7, 4))[0]
        assert a != segment_selection(groups, rule, 12, selection_rng(8, 3))[0]
    # the rng is a function of (seed, step) only: the string memrl has always used
    assert selection_rng(7, 3).random() == random.Random("dcpo:7:3").random()
