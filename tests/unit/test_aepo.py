"""AEPO (QwenLong-L1.5): the entropy gate, the rows it keeps and the batch entropy it reads, by hand."""

from __future__ import annotations

import pytest

from memrl.algorithms.losses import row_weights
from memrl.algorithms.selection import aepo_gate, aepo_rows, batch_entropy
from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig
from memrl.types import Segment


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
