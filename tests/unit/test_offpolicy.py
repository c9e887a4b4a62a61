"""Off-policy correction (algorithm.off_policy: none / tis / decoupled) and the train/inference mismatch
metrics, against numbers worked out by hand on three tokens (docs/guides/async.md)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from memrl.algorithms.losses import mismatch_means, mismatch_sums, off_policy_weights
from memrl.config import ConfigError, load_config
from memrl.training.algorithm_section import off_policy_cap
from memrl.training.config import TrainConfig
from memrl.training.step.step_metrics import combine_step_metrics
from memrl.training.update.packing import collate
from memrl.training.update.policy import ppo_micro_loss
from memrl.types import Segment

# Three trained tokens (a fourth, masked out, must count nowhere). Trainer lp, engine lp:
#   token 1: -1.0 vs -1.0  -> d = trainer - engine = 0
#   token 2: -2.0 vs -1.5  -> d = -0.5
#   token 3: -0.5 vs -1.5  -> d = +1.0
#   token 4: -9.0 vs -0.1  (mask 0)
TRAINER = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
ENGINE = torch.tensor([[-1.0, -1.5, -1.5, -0.1]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def test_mismatch_sums_by_hand():
    s = mismatch_sums(TRAINER, ENGINE, MASK, clip=2.0)
    assert s["tokens"] == 3.0
    assert s["abs_diff"] == pytest.approx(0.0 + 0.5 + 1.0)
    # k3 = e^d - 1 - d: 0; e^-0.5 - 0.5 = 0.10653066; e - 2 = 0.71828183
    assert s["k3"] == pytest.approx(0.10653066 + 0.71828183, abs=1e-7)
    # ratio e^d outside [1/2, 2] <=> |d| > ln 2 = 0.693: only token 3 (e^1 = 2.718); token 2's e^-0.5 = 0.607 is inside
    assert s["outside"] == 1.0
    m = mismatch_means(s)
    assert m == pytest.approx({"abs_logprob_diff_mean": 0.5, "kl_k3": 0.27493750, "ratio_outside_share": 1 / 3,
                               "tokens": 3.0})
    # a wider band: nothing outside [1/3, 3]; identical logprobs: all zero
    assert mismatch_sums(TRAINER, ENGINE, MASK, clip=3.0)["outside"] == 0.0
    assert mismatch_sums(ENGINE, ENGINE, MASK, clip=2.0) == {"abs_diff": 0.0, "k3": 0.0, "outside": 0.0, "tokens": 3.0}
    assert mismatch_means({"abs_diff": 0.0, "k3": 0.0, "outside": 0.0, "tokens": 0.0}) == {}


def test_off_policy_weights_by_hand():
    old, behaviour = TRAINER[:, :3], ENGINE[:, :3]
    # w = exp(old - behaviour) = [1, e^-0.5, e^1] = [1, 0.60653066, 2.71828183]
    assert off_policy_weights(old, behaviour, "none", None).tolist() == [[1.0, 1.0, 1.0]]
    tis = off_policy_weights(old, behaviour, "tis", 2.0)
    assert tis[0].tolist() == pytest.approx([1.0, 0.60653066, 2.0])  # truncated at C = 2
    dec = off_policy_weights(old, behaviour, "decoupled", 2.0)
    assert dec[0].tolist() == pytest.approx([1.0, 0.60653066, 0.0])  # above the cap: dropped (AReaL)
    assert off_policy_weights(old, behaviour, "decoupled", None)[0].tolist() == pytest.approx([1.0, 0.60653066,
                                                                                              2.71828183])
    x = old.clone().requires_grad_(True)
    assert not off_policy_weights(x, behaviour, "tis", 2.0).requires_grad  # a constant weight (sg[w])
    with pytest.raises(ValueError, match="unknown off-policy correction 'is'"):
        off_policy_weights(old, behaviour, "is", 2.0)


class _Fixed(torch.nn.Module):
    """A 'model' whose logits are a parameter: position t holds [ln p_t, ln(1 - p_t)], so the log-softmax
    of token 0 is exactly ln p_t."""

    def __init__(self, p: list[float]) -> None:
        super().__init__()
        z = [[math.log(q), math.log(1 - q)] for q in p] + [[0.0, 0.0]]
        self.z = torch.nn.Parameter(torch.tensor([z], dtype=torch.float32))

    def forward(self, input_ids, attention_mask):  # noqa: ARG002 - the interface token_logprobs calls
        return SimpleNamespace(logits=self.z)


P = [0.5, 0.8, 0.25]
"""Trainer probabilities of the three response tokens: lp = [-0.693147, -0.223144, -1.386294]. Engine lp:
[ln 0.5, -0.5, -0.5], so the train/inference ratios exp(trainer - engine) = [1, 0.8 e^0.5, 0.25 e^0.5] =
[1, 1.31897702, 0.41218032]."""


def _loss(mode: str, cap: float | None):
    model = _Fixed(P)
    seg = Segment([0], [0, 0, 0], [math.log(0.5), -0.5, -0.5], advantage=1.0)
    mb = collate([seg], [1 / 3])  # token-mean over 3 tokens
    part = ppo_micro_loss(model, mb, 1.0, "ppo", {"clip_low": 0.2, "clip_high": 0.2, "dual_clip_c": 3.0},
                          off_policy=mode, off_policy_cap=cap, mismatch_clip=1.25)
    part.loss.backward()
    return part, model.z.grad[0, :3, 0].tolist()


def test_ppo_loss_and_gradient_per_mode_by_hand():
    r2, r3 = 0.8 * math.exp(0.5), 0.25 * math.exp(0.5)
    # none (unchanged): ratio against the engine, clipped to [0.8, 1.2]; A = 1: -min(r, clip(r)) / 3 each
    part, g = _loss("none", None)
    assert float(part.loss.detach()) == pytest.approx(-(1 + 1.2 + r3) / 3, abs=1e-6)
    # d loss / d z_t0 = d loss / d lp_t * (1 - p_t); token 2 is clipped (no gradient), the others -r_t / 3
    assert g == pytest.approx([-(1 / 3) * 0.5, 0.0, -(1 / 3) * r3 * 0.75], abs=1e-6)
    # tis, C = 1.5: ratio against the detached trainer lp (1 everywhere), times min(r, 1.5) = [1, r2, r3]
    part, g = _loss("tis", 1.5)
    assert float(part.loss.detach()) == pytest.approx(-(1 + r2 + r3) / 3, abs=1e-6)
    assert g == pytest.approx([-(1 / 3) * 0.5, -(1 / 3) * r2 * 0.2, -(1 / 3) * r3 * 0.75], abs=1e-6)
    assert part.sums["is_weight"] == pytest.approx((1 + r2 + r3) / 3, abs=1e-6)
    # tis, C = 1.2: token 2's weight truncated to 1.2
    part, g = _loss("tis", 1.2)
    assert float(part.loss.detach()) == pytest.approx(-(1 + 1.2 + r3) / 3, abs=1e-6)
    assert g[1] == pytest.approx(-(1 / 3) * 1.2 * 0.2, abs=1e-6)
    # decoupled, cap 1.25: token 2 (behaviour weight 1.319) drops out
    part, g = _loss("decoupled", 1.25)
    assert float(part.loss.detach()) == pytest.approx(-(1 + r3) / 3, abs=1e-6)
    assert g == pytest.approx([-(1 / 3) * 0.5, 0.0, -(1 / 3) * r3 * 0.75], abs=1e-6)
    # the mismatch sums of the same forward: |d| = [0, ln 1.319, -ln 0.412]; band [0.8, 1.25]: tokens 2 and 3
    assert part.mismatch["tokens"] == 3.0 and part.mismatch["outside"] == 2.0
    assert part.mismatch["abs_diff"] == pytest.approx(0.27685645 + 0.88629436, abs=1e-6)
    assert part.mismatch["k3"] == pytest.approx((r2 - 1 - math.log(r2)) + (r3 - 1 - math.log(r3)), abs=1e-6)


PROX = [math.log(0.5), math.log(0.7), math.log(0.25)]
"""algorithm.old_logprobs=trainer: the trainer's recomputed pre-update logprobs of the same three tokens."""


def _loss_prox(mode: str, cap: float | None):
    model = _Fixed(P)
    seg = Segment([0], [0, 0, 0], [math.log(0.5), -0.5, -0.5], advantage=1.0, old_logprobs=PROX)
    mb = collate([seg], [1 / 3])
    part = ppo_micro_loss(model, mb, 1.0, "ppo", {"clip_low": 0.2, "clip_high": 0.2, "dual_clip_c": 3.0},
                          off_policy=mode, off_policy_cap=cap, mismatch_clip=1.25)
    part.loss.backward()
    return part, model.z.grad[0, :3, 0].tolist()


def test_recomputed_old_logprobs_are_the_ratio_by_hand():
    # ratio against the recompute: p / prox = [0.5/0.5, 0.8/0.7, 0.25/0.25] = [1, 1.14285714, 1], all inside
    # [0.8, 1.2]; the engine's logprobs take no part (against them token 2 would clip at 1.2, token 3 be 0.412)
    r2 = 0.8 / 0.7
    part, g = _loss_prox("none", None)
    assert float(part.loss.detach()) == pytest.approx(-(1 + r2 + 1) / 3, abs=1e-6)
    assert g == pytest.approx([-(1 / 3) * 0.5, -(1 / 3) * r2 * 0.2, -(1 / 3) * 1 * 0.75], abs=1e-6)
    # tis, C = 1.5: behaviour = engine, proximal = the recompute: w = min(exp(prox - engine), 1.5)
    #   = [1, 0.7 e^0.5, 0.25 e^0.5] = [1, 1.15410462, 0.41218032]
    w2, w3 = 0.7 * math.exp(0.5), 0.25 * math.exp(0.5)
    part, _ = _loss_prox("tis", 1.5)
    assert float(part.loss.detach()) == pytest.approx(-(1 + r2 * w2 + w3) / 3, abs=1e-6)
    assert part.sums["is_weight"] == pytest.approx((1 + w2 + w3) / 3, abs=1e-6)
    # both pairs of the mismatch: |prox - engine| = [0, |ln 0.7 + 0.5|, |ln 0.25 + 0.5|] = [0, 0.14332506,
    # 0.88629436]; |current - prox| = [0, ln(8/7), 0] = [0, 0.13353139, 0]
    assert part.pairs["old_vs_engine"]["abs_diff"] == pytest.approx(0.14332506 + 0.88629436, abs=1e-6)
    assert part.pairs["current_vs_old"]["abs_diff"] == pytest.approx(0.13353139, abs=1e-6)
    assert part.pairs["old_vs_engine"]["tokens"] == 3.0
    # without the recompute there are no pairs (the logged mismatch is this forward vs the engine, as before)
    assert _loss("none", None)[0].pairs == {}


def test_step_metrics_weigh_mismatch_by_tokens():
    a = {"mismatch/hf/abs_logprob_diff_mean": 0.5, "mismatch/hf/kl_k3": 0.2, "mismatch/hf/tokens": 3.0,
         "loss/total": 1.0}
    b = {"mismatch/hf/abs_logprob_diff_mean": 0.1, "mismatch/hf/kl_k3": 0.6, "mismatch/hf/tokens": 1.0,
         "loss/total": 3.0}
    out = combine_step_metrics([a, b])
    assert out["mismatch/hf/abs_logprob_diff_mean"] == pytest.approx((3 * 0.5 + 1 * 0.1) / 4)
    assert out["mismatch/hf/kl_k3"] == pytest.approx((3 * 0.2 + 1 * 0.6) / 4)
    assert out["mismatch/hf/tokens"] == 4.0 and out["loss/total"] == 2.0


def test_off_policy_config():
    cfg = load_config(TrainConfig, ["algorithm.off_policy=tis", "algorithm.tis_cap=3"])
    assert off_policy_cap(cfg.algorithm) == 3.0
    cfg = load_config(TrainConfig, ["algorithm.off_policy=decoupled"])
    assert off_policy_cap(cfg.algorithm) is None and cfg.algorithm.mismatch_clip == 2.0
    assert off_policy_cap(load_config(TrainConfig, []).algorithm) is None
    with pytest.raises(ConfigError, match="needs one optimizer step per RL step"):
        load_config(TrainConfig, ["algorithm.off_policy=tis", "trainer.mini_batches=2", "trainer.batch_size=4",
                                  "model.path=x"]).check()
    # with the recomputed old logprobs the proximal policy is the pre-update one in every mini-batch
    load_config(TrainConfig, ["algorithm.off_policy=tis", "algorithm.old_logprobs=trainer", "trainer.mini_batches=2",
                              "trainer.batch_size=4", "model.path=x"]).check()
    with pytest.raises(ConfigError, match="algorithm.old_logprobs"):
        load_config(TrainConfig, ["algorithm.old_logprobs=actor"])
    # MemAct's re-encoded turns hold ids the engine may not have sampled (logprob 0.0 placeholders)
    with pytest.raises(ConfigError, match="turn_tokens=reencoded needs algorithm.old_logprobs=trainer and "
                                          "algorithm.off_policy=none \\(got engine and none\\)"):
        load_config(TrainConfig, ["workflow=memact", "workflow.turn_tokens=reencoded", "model.path=x"]).check()
    with pytest.raises(ConfigError, match="\\(got trainer and tis\\)"):
        load_config(TrainConfig, ["workflow=memact", "workflow.turn_tokens=reencoded", "algorithm.old_logprobs=trainer",
                                  "algorithm.off_policy=tis", "model.path=x"]).check()
    load_config(TrainConfig, ["workflow=memact", "workflow.turn_tokens=reencoded", "algorithm.old_logprobs=trainer",
                              "model.path=x"]).check()
    with pytest.raises(ConfigError, match="off_policy"):
        load_config(TrainConfig, ["algorithm.off_policy=is"])
    with pytest.raises(ConfigError, match="mismatch_clip"):
        load_config(TrainConfig, ["algorithm.mismatch_clip=1"])
