"""AEPO (QwenLong-L1.5): the entropy gate, the rows it keeps and the batch entropy it reads, by hand."""

from __future__ import annotations

import pytest

from memrl.algorithms.losses import row_weights
from memrl.algorithms.selection import aepo_gate, aepo_rows, batch_entropy, truncate_to_multiple
from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig
from memrl.training.step.step_extras import aepo_select
from memrl.types import Group, Segment, Trajectory


def seg(traj: str, adv: float, n: int = 1) -> Segment:
    return Segment([1], [2] * n, [-0.1] * n, advantage=adv, trajectory_id=traj)


def test_gate_is_the_open_band():
    assert aepo_gate(0.5, 0.2, 0.8) and not aepo_gate(0.2, 0.2, 0.8) and not aepo_gate(0.8, 0.2, 0.8)
    assert aepo_gate(3.0, 0.2, None) and not aepo_gate(0.1, 0.2, None)  # "above an upper bound" reading
    assert aepo_gate(0.0, None, None)


def test_rows_kept_need_a_positive_advantage_and_reward():
    # a#0: A = +1, reward 1 -> kept; a#1: A = -1 -> dropped; b#0: A = +0.5 but reward 0 (a positive advantage
    # from a mean below zero) -> dropped; b#1: A = 0 -> dropped
    rows = [[seg("a#0", 1.0), seg("a#1", -1.0)], [seg("b#0", 0.5), seg("b#1", 0.0)]]
    rewards = {"a#0": 1.0, "a#1": 0.0, "b#0": 0.0, "b#1": -1.0}
    kept = aepo_rows(rows, rewards)
    assert [[s.trajectory_id for s in g] for g in kept] == [["a#0"], []]


def test_batch_entropy_follows_the_loss_aggregation():
    # two rows of 1 and 3 trained tokens, entropy sums 0.5 and 2.1 (token means 0.5 and 0.7)
    masks = [[1], [1, 1, 1]]
    # token-mean: (0.5 + 2.1) / 4 = 0.65; seq-mean-token-mean: (0.5 / 1 + 2.1 / 3) / 2 = 0.6
    assert batch_entropy([0.5, 2.1], row_weights(masks, mode="token-mean")) == pytest.approx(0.65)
    assert batch_entropy([0.5, 2.1], row_weights(masks, mode="seq-mean-token-mean")) == pytest.approx(0.6)


def test_config_refusals():
    with pytest.raises(ConfigError, match="algorithm.aepo.enabled=true needs algorithm.old_logprobs=trainer"):
        load_config(TrainConfig, ["algorithm.aepo.enabled=true", "model.path=x"]).check()
    with pytest.raises(ConfigError, match="algorithm.aepo.entropy_low=0.5 must be < algorithm.aepo.entropy_high=0.5"):
        load_config(TrainConfig, ["algorithm.aepo.enabled=true", "algorithm.old_logprobs=trainer",
                                  "algorithm.aepo.entropy_low=0.5", "algorithm.aepo.entropy_high=0.5",
                                  "model.path=x"]).check()
    with pytest.raises(ConfigError, match="algorithm.aepo.entropy_low"):
        load_config(TrainConfig, ["algorithm.aepo.entropy_low=-1", "model.path=x"])


def test_kept_rows_cut_to_a_multiple_in_batch_order():
    # 5 kept rows over 3 groups, multiple 2 -> the first 4 in batch order: a0 a1 | b0 | c0 (c1 dropped);
    # multiple 3 -> a0 a1 | b0 | -; 0 and 1 keep all; multiple 8 > 5 rows -> none
    rows = [[seg("a0", 1), seg("a1", 1)], [seg("b0", 1)], [seg("c0", 1), seg("c1", 1)]]
    ids = lambda kept: [[s.trajectory_id for s in g] for g in kept]  # noqa: E731
    assert ids(truncate_to_multiple(rows, 2)) == [["a0", "a1"], ["b0"], ["c0"]]
    assert ids(truncate_to_multiple(rows, 3)) == [["a0", "a1"], ["b0"], []]
    assert ids(truncate_to_multiple(rows, 0)) == ids(truncate_to_multiple(rows, 1)) == ids(rows)
    assert ids(truncate_to_multiple(rows, 8)) == [[], [], []]


def test_the_gate_cuts_the_kept_rows_when_asked():
    # 3 rows, all A = +1 from reward-1 trajectories, one trained token each with entropy 0.5: the batch
    # entropy (token-mean) is 0.5, inside (0.1, none) -> gate on; every row qualifies; keep_multiple_of 2 keeps
    # the first 2 (a0, b0), 0 keeps all 3
    segs = [seg("a0", 1.0), seg("b0", 1.0), seg("c0", 1.0)]
    groups = [Group(s.trajectory_id, [Trajectory(s.trajectory_id, s.trajectory_id, [s], reward=1.0)]) for s in segs]
    for multiple, kept in ((2, [["a0"], ["b0"], []]), (0, [["a0"], ["b0"], ["c0"]])):
        a = load_config(TrainConfig, ["algorithm.aepo.enabled=true", "algorithm.old_logprobs=trainer",
                                      "algorithm.aepo.entropy_low=0.1", f"algorithm.aepo.keep_multiple_of={multiple}",
                                      "model.path=x"]).algorithm
        per_group, m = aepo_select(a, [[s] for s in segs], segs, [[0.5]] * 3, groups)
        assert [[s.trajectory_id for s in g] for g in per_group] == kept
        assert (m["aepo/entropy"], m["aepo/active"], m["aepo/rows_kept"], m["aepo/rows_dropped"]) == \
            (pytest.approx(0.5), 1.0, float(sum(map(len, kept))), float(3 - sum(map(len, kept))))
