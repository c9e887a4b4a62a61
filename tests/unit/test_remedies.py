"""clip_cov, kl_cov and the LLDS-style term (memrl.algorithms.remedies) against values worked out by hand.

Upstream read: verl, verl/trainer/ppo/core_algos.py, compute_policy_loss_clip_cov and
compute_policy_loss_kl_cov (arXiv 2505.22617, section 4: Clip-Cov and KL-Cov); the LLDS term follows the
description of arXiv 2512.04220 (a row's term acts only when its likelihood fell, on the tokens whose
log-probability fell).

The shared batch: one row, logp = [-1, -2, -0.5, -3] and a fifth, untrained token; A = [2, -2, 2, -2] (the
fifth 2). Over the trained tokens mean A = 0 and mean logp = -6.5 / 4 = -1.625, so
logp - mean = [0.625, -0.375, 1.125, -1.375] and the covariances A (logp - mean) = [1.25, 0.75, 2.25, 2.75].
"""

from __future__ import annotations

import math

import pytest
import torch

from memrl.algorithms.registry import get_loss, loss_options
from memrl.algorithms.remedies import clip_cov_loss, kl_cov_loss, llds_term, token_covariance

LP = [-1.0, -2.0, -0.5, -3.0, -10.0]
ADV = torch.tensor([[2.0, -2.0, 2.0, -2.0, 2.0]])
MASK = torch.tensor([[1, 1, 1, 1, 0]])


def _lp(values=LP) -> torch.Tensor:
    return torch.tensor([values], requires_grad=True)


def test_covariance_by_hand():
    cov = token_covariance(_lp(), ADV, MASK)[0, :4]
    assert torch.allclose(cov, torch.tensor([1.25, 0.75, 2.25, 2.75]))


def test_clip_cov_cuts_the_band_but_not_what_ppo_clipped():
    """old = logp except token 2 (old -1.0): its ratio e^0.5 = 1.6487 > 1.2 with A = 2 > 0, so PPO clips it
    (loss -2 * 1.2 = -2.4) and it is no candidate. The band (1, 5) holds tokens 0 (1.25), 2 (2.25) and 3
    (2.75); token 1 (0.75) is outside. ratio 1.0 -> up to 4 cuts: tokens 0 and 3 get loss 0."""
    lp = _lp()
    old = torch.tensor([[-1.0, -2.0, -1.0, -3.0, -10.0]])
    loss, stats = clip_cov_loss(lp, old, ADV, MASK, clip_cov_ratio=1.0)
    assert torch.allclose(loss, torch.tensor([[0.0, 2.0, -2.4, 0.0, 0.0]]))
    assert stats["cov_share"] == 0.5 and stats["clipfrac"] == 0.25
    assert stats["approx_kl"] == pytest.approx(-0.5 / 4)  # mean(old - logp) = (0 + 0 - 0.5 + 0) / 4
    loss.sum().backward()
    # token 1: d(-A rho)/dlogp = -A rho = 2; tokens 0, 3 cut; token 2 clipped: no gradient
    assert torch.allclose(lp.grad, torch.tensor([[0.0, 2.0, 0.0, 0.0, 0.0]]))


def test_clip_cov_picks_int_ratio_times_tokens_at_random():
    """ratio 0.25: max(int(0.25 * 4), 1) = 1 of the candidates 0 and 3 is cut (token 0's loss -2 or 3's 2)."""
    torch.manual_seed(0)
    old = torch.tensor([[-1.0, -2.0, -1.0, -3.0, -10.0]])
    loss, stats = clip_cov_loss(_lp(), old, ADV, MASK, clip_cov_ratio=0.25)
    assert stats["cov_share"] == 0.25
    assert loss[0, :4].tolist() in ([0.0, 2.0, pytest.approx(-2.4), 2.0], [-2.0, 2.0, pytest.approx(-2.4), 0.0])
    with pytest.raises(ValueError, match="clip_cov_lb=5.0 must be < algorithm.clip_cov.clip_cov_ub=5.0"):
        loss_options("clip_cov")(clip_cov_lb=5.0)


def test_kl_cov_adds_the_kl_term_on_the_top_covariance_tokens():
    """old = [-1, -2.5, -0.5, -2]: logp - old = [0, 0.5, 0, -1]. -A rho = [-2, 2 e^0.5, -2, 2 e^-1];
    ratio 0.25 -> 1 token, the largest covariance (token 3, 2.75) gets + 1.0 * |-1|."""
    lp = _lp()
    old = torch.tensor([[-1.0, -2.5, -0.5, -2.0, -10.0]])
    loss, stats = kl_cov_loss(lp, old, ADV, MASK, kl_cov_ratio=0.25)
    want = [-2.0, 2 * math.exp(0.5), -2.0, 2 * math.exp(-1.0) + 1.0, 0.0]
    assert torch.allclose(loss, torch.tensor([want]))
    assert stats["cov_share"] == 0.25 and stats["approx_kl"] == pytest.approx((0 - 0.5 + 0 + 1) / 4)
    loss.sum().backward()
    # token 3: -A rho + sign(logp - old) * coef = 2 e^-1 - 1
    assert lp.grad[0, 3].item() == pytest.approx(2 * math.exp(-1.0) - 1.0)
    assert lp.grad[0, 1].item() == pytest.approx(2 * math.exp(0.5))
    # ratio 0.5 -> tokens 3 and 2 (2.25); token 2's |logp - old| is 0: the same loss, twice the share
    loss2, stats2 = kl_cov_loss(_lp(), old, ADV, MASK, kl_cov_ratio=0.5, ppo_kl_coef=1.0)
    assert torch.allclose(loss2, torch.tensor([want])) and stats2["cov_share"] == 0.5


def test_llds_term_acts_only_where_the_row_likelihood_fell():
    """Row 0: logp - old = [-0.5, 0.5, -0.1], sum -0.1 < 0: the term max(0, old - logp) = [0.5, 0, 0.1].
    Row 1: [-0.2, 0.1 | -0.3 untrained], trained sum -0.1 < 0: [0.2, 0, 0]. Row 2: [-0.5, 0.5, 0], sum 0:
    it did not fall, no term. rows=positive (A = 1, -1, 1): row 1 drops out."""
    lp = torch.tensor([[-1.0, -2.0, -0.5]] * 3, requires_grad=True)
    old = torch.tensor([[-0.5, -2.5, -0.4], [-0.8, -2.1, -0.2], [-0.5, -2.5, -0.5]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -1.0, 1.0])
    term = llds_term(lp, old, mask, adv)
    assert torch.allclose(term, torch.tensor([[0.5, 0.0, 0.1], [0.2, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    term.sum().backward()
    assert torch.equal(lp.grad, torch.tensor([[-1.0, 0.0, -1.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    positive = llds_term(lp, old, mask, adv, rows="positive")
    assert torch.allclose(positive, torch.tensor([[0.5, 0.0, 0.1], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_registered_with_options_and_config_sections():
    from memrl.config import load_config
    from memrl.training.config import TrainConfig
    from memrl.training.update.optim import skips_zero_advantage

    assert get_loss("clip_cov") is clip_cov_loss and get_loss("kl_cov") is kl_cov_loss
    cfg = load_config(TrainConfig, ["model.path=x", "algorithm.loss=kl_cov", "algorithm.kl_cov.kl_cov_ratio=0.002"])
    assert cfg.algorithm.options()[1].kl_cov_ratio == 0.002
    assert not skips_zero_advantage(cfg)  # only the ppo loss skips A = 0 rows
    llds = load_config(TrainConfig, ["model.path=x", "algorithm.kl_coef=0", "algorithm.llds.coef=0.1"])
    assert not skips_zero_advantage(llds)  # the term reaches rows with A = 0
    assert skips_zero_advantage(load_config(TrainConfig, ["model.path=x", "algorithm.kl_coef=0"]))
