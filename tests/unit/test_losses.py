"""PPO clip loss, KL estimators, entropy and loss aggregation weights (exact under micro-batching).

Every expected value is written out by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from memrl.algorithms.losses import (
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    loss_token_weights,
    ppo_clip_loss,
    row_weights,
)
from memrl.algorithms.registry import get_loss, loss_names

# One row of six tokens, (advantage, ratio) per token; old logprobs 0 so logprobs = ln(ratio).
ADV = [1.0, 1.0, -1.0, -1.0, 2.0, 1.0]
RATIO = [1.1, 1.5, 0.5, 5.0, 0.5, 10.0]
MASK = [1, 1, 1, 1, 1, 0]


def ppo_inputs():
    lp = torch.tensor([[math.log(r) for r in RATIO]], dtype=torch.float64)
    return lp, torch.zeros_like(lp), torch.tensor([ADV], dtype=torch.float64), torch.tensor([MASK])


def test_ppo_clip_loss_hand_computed():
    loss, stats = ppo_clip_loss(*ppo_inputs(), clip_low=0.2, clip_high=0.2, dual_clip_c=3.0)
    # token: -A*r, -A*clip(r, 0.8, 1.2) -> max -> dual clip (A < 0: min with -A*3)
    # 1: A=1,  r=1.1: -1.1, -1.1 -> -1.1
    # 2: A=1,  r=1.5: -1.5, -1.2 -> -1.2                 (clipped)
    # 3: A=-1, r=0.5:  0.5,  0.8 ->  0.8 -> min(0.8, 3) = 0.8   (clipped)
    # 4: A=-1, r=5.0:  5.0,  1.2 ->  5.0 -> min(5, 3) = 3.0     (dual clip)
    # 5: A=2,  r=0.5: -1.0, -1.6 -> -1.0
    # 6: masked -> 0
    assert loss[0].tolist() == pytest.approx([-1.1, -1.2, 0.8, 3.0, -1.0, 0.0])
    # clipfrac = tokens 2, 3 of 5 = 0.4; clipfrac_lower = token 4 of 5 = 0.2
    # approx_kl = mean(old - new) = -ln(1.1 * 1.5 * 0.5 * 5 * 0.5) / 5 = -ln(2.0625) / 5 = -0.7239188 / 5
    assert stats == pytest.approx({"clipfrac": 0.4, "clipfrac_lower": 0.2, "approx_kl": -0.14478376})


def test_ppo_clip_higher_and_no_dual_clip():
    loss, _ = ppo_clip_loss(*ppo_inputs(), clip_low=0.2, clip_high=0.28, dual_clip_c=None)
    # token 2: -1 * clip(1.5, 0.8, 1.28) = -1.28; token 4 without dual clip stays max(5, 1.28) = 5
    assert loss[0].tolist() == pytest.approx([-1.1, -1.28, 0.8, 5.0, -1.0, 0.0])


def test_ppo_per_row_advantages_and_gradient():
    # advantages given per row [B] broadcast over the tokens: A = 1 everywhere
    lp = torch.tensor([[math.log(1.1), math.log(1.5)]], requires_grad=True)
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    assert loss[0].tolist() == pytest.approx([-1.1, -1.2])
    loss.sum().backward()
    # d(-r)/d(lp) = -r for the unclipped token; 0 for the clipped one
    assert lp.grad[0].tolist() == pytest.approx([-1.1, 0.0])


def test_ppo_rejects_a_bad_dual_clip():
    with pytest.raises(ValueError, match="dual_clip_c must be > 1.0"):
        ppo_clip_loss(*ppo_inputs(), dual_clip_c=0.5)


def test_kl_estimators():
    lp, ref = torch.tensor([math.log(0.5), 0.0]), torch.tensor([math.log(0.25), 0.0])
    # d = ln 0.5 - ln 0.25 = ln 2 = 0.6931472; second token d = 0
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx([0.6931472, 0.0])
    # k2 = d^2 / 2 = 0.480453 / 2
    assert kl_penalty(lp, ref, "k2").tolist() == pytest.approx([0.2402265, 0.0])
    # k3 = e^-d + d - 1 = 0.5 + 0.6931472 - 1
    assert kl_penalty(lp, ref, "k3").tolist() == pytest.approx([0.1931472, 0.0])
    assert kl_penalty(lp, ref, "low_var_kl").tolist() == pytest.approx([0.1931472, 0.0])
    # k3 clamps: d = -30 -> log-ratio clamped to 20 -> e^20 - 21 -> clamped to 10
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "k3").tolist() == [10.0]
    with pytest.raises(ValueError, match="unknown KL estimator 'k9'; known: k1, k2, k3, low_var_kl"):
        kl_penalty(lp, ref, "k9")


def test_entropy_from_logits():
    # uniform over 4: ln 4 = 1.3862944
    assert entropy_from_logits(torch.zeros(1, 4)).tolist() == pytest.approx([1.3862944])
    # logits [0, ln 3] -> p = [0.25, 0.75]: H = 0.25 ln 4 + 0.75 ln(4/3) = 0.3465736 + 0.2157616
    assert entropy_from_logits(torch.tensor([0.0, math.log(3.0)])).item() == pytest.approx(0.5623351)


# Rows: 2 tokens, 1 token, 0 tokens, 4 tokens (7 trained tokens, 3 rows that train).
# Trajectories: a = rows 0, 1 (3 tokens), b = row 2 (0 tokens), c = row 3 (4 tokens).
MASKS = [[1, 1, 0], [1], [0, 0], [1, 1, 1, 1]]
TRAJ = ["a", "a", "b", "c"]


@pytest.mark.parametrize(
    "mode, expected",
    [
        # 1 / 7 on every trained token
        ("token-mean", [[1 / 7, 1 / 7, 0], [1 / 7], [0, 0], [1 / 7] * 4]),
        # 1 / (3 rows * row tokens): 1/6, 1/3, 1/12
        ("seq-mean-token-mean", [[1 / 6, 1 / 6, 0], [1 / 3], [0, 0], [1 / 12] * 4]),
        # 1 / 3 rows
        ("seq-mean-token-sum", [[1 / 3, 1 / 3, 0], [1 / 3], [0, 0], [1 / 3] * 4]),
        # 1 / (2 trajectories * trajectory tokens): a -> 1/6, c -> 1/8
        ("traj-mean", [[1 / 6, 1 / 6, 0], [1 / 6], [0, 0], [1 / 8] * 4]),
    ],
)
def test_loss_token_weights(mode, expected):
    got = loss_token_weights(MASKS, TRAJ, mode)
    assert [pytest.approx(r) for r in expected] == got


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", [1 / 7, 1 / 7, 0.0, 1 / 7]),
    ("seq-mean-token-mean", [1 / 6, 1 / 3, 0.0, 1 / 12]),
    ("seq-mean-token-sum", [1 / 3, 1 / 3, 0.0, 1 / 3]),
    ("traj-mean", [1 / 6, 1 / 6, 0.0, 1 / 8]),
])
def test_row_weights_one_per_row_and_spread_over_its_trained_tokens(mode, expected):
    assert row_weights(MASKS, TRAJ, mode) == expected  # the same divisions as by hand: exact
    assert loss_token_weights(MASKS, TRAJ, mode) == [[w if v else 0.0 for v in m] for w, m in zip(expected, MASKS, strict=True)]


def test_loss_token_weights_errors_and_empty_batch():
    with pytest.raises(
        ValueError, match="traj-mean aggregation needs one trajectory id per row: 4 rows, none"
    ):
        loss_token_weights(MASKS, None, "traj-mean")
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'mean'"):
        loss_token_weights(MASKS, TRAJ, "mean")
    assert loss_token_weights([[0, 0], [0]], ["x", "y"], "token-mean") == [[0.0, 0.0], [0.0]]


NAN = float("nan")
# The same rows padded to length 4; masked positions hold junk (even NaN) that must not leak in.
LOSS = [[1.0, 2.0, 100.0, NAN], [3.0, 100.0, 100.0, 100.0], [100.0, NAN, 100.0, 100.0], [1.0, 2.0, 3.0, 4.0]]
PADDED = [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 16 / 7),  # (1 + 2 + 3 + 1 + 2 + 3 + 4) / 7
        ("seq-mean-token-mean", 7 / 3),  # row means 1.5, 3, 2.5 -> 7 / 3
        ("seq-mean-token-sum", 16 / 3),  # row sums 3, 3, 10 -> 16 / 3
        ("traj-mean", 2.25),  # a: (1 + 2 + 3) / 3 = 2, c: 10 / 4 = 2.5 -> 2.25
    ],
)
def test_agg_loss(mode, expected):
    got = agg_loss(torch.tensor(LOSS, dtype=torch.float64), torch.tensor(PADDED), mode, TRAJ)
    assert got.item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "traj-mean"])
def test_micro_batches_sum_to_the_full_batch_loss_and_gradient(mode):
    torch.manual_seed(0)
    b, length = 5, 6
    masks = [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [0, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
    ]
    traj = ["t1", "t1", "t2", "t3", "t3"]  # t1's and t3's rows end up in different micro-batches
    mask = torch.tensor(masks)
    old = -torch.rand(b, length, dtype=torch.float64)
    ref = -torch.rand(b, length, dtype=torch.float64)
    adv = torch.randn(b, dtype=torch.float64)
    theta = (old + 0.3 * torch.randn(b, length, dtype=torch.float64)).requires_grad_()

    def token_loss(rows):
        pg, _ = ppo_clip_loss(theta[rows], old[rows], adv[rows], mask[rows], clip_high=0.28)
        return pg + 0.1 * kl_penalty(theta[rows], ref[rows], "k3")

    weights = torch.tensor(loss_token_weights(masks, traj, mode), dtype=torch.float64)
    full = (weights * token_loss(slice(None))).sum()
    (full_grad,) = torch.autograd.grad(full, theta)
    assert full.item() == pytest.approx(agg_loss(token_loss(slice(None)), mask, mode, traj).item())

    parts = [[0, 2], [1, 3, 4]]  # any split of the rows; weights stay the full-batch ones
    total = sum((weights[rows] * token_loss(rows)).sum() for rows in parts)
    (split_grad,) = torch.autograd.grad(total, theta)
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(split_grad, full_grad, rtol=1e-12, atol=1e-15)


def test_per_micro_batch_token_mean_is_not_the_full_batch_loss():
    # why the weights exist: averaging inside each micro-batch and then over micro-batches is wrong
    # rows [[1, 2]] and [[6]]: full token-mean = 9 / 3 = 3; mean of micro-batch means = (1.5 + 6) / 2 = 3.75
    loss = torch.tensor([[1.0, 2.0], [6.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    full = agg_loss(loss, mask, "token-mean")
    naive = (agg_loss(loss[:1], mask[:1], "token-mean") + agg_loss(loss[1:], mask[1:], "token-mean")) / 2
    assert (full.item(), naive.item()) == pytest.approx((3.0, 3.75))


def test_loss_registry():
    assert get_loss("ppo") is ppo_clip_loss
    assert "ppo" in loss_names()
    with pytest.raises(KeyError, match="unknown policy loss 'cispo'; known: clip_cov, gspo, kl_cov, ppo"):
        get_loss("cispo")
