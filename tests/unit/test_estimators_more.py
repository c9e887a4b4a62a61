"""RLOO, REINFORCE++ (and its baseline variant), GRPO with QwenLong-L1.5's per-task std, and the GSPO loss:
every expected value worked out by hand in the comments, from verl's core_algos definitions."""

from __future__ import annotations

import math

import pytest
import torch

from memrl.algorithms.advantages import (
    compute_group_advantages,
    grpo_task_advantages,
    rloo_advantages,
    token_whiten,
)
from memrl.algorithms.losses import gspo_loss, loss_token_weights
from memrl.algorithms.registry import advantage_names, advantage_options, loss_names, loss_options
from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig
from memrl.types import Group, Segment, Task, Trajectory


def seg(n_tokens: int = 1) -> Segment:
    return Segment(prompt_ids=[1], response_ids=[2] * n_tokens, response_logprobs=[-0.1] * n_tokens)


def traj(task: str, k: int, reward: float, tokens: tuple[int, ...] = (1,)) -> Trajectory:
    return Trajectory(task, f"{task}#{k}", [seg(n) for n in tokens], reward=reward)


def group(task: str, rewards: list[float], tokens: tuple[int, ...] = (1,), source: str | None = None) -> Group:
    meta = {} if source is None else {"data_source": source}
    return Group(task, [traj(task, k, r, tokens) for k, r in enumerate(rewards)], Task(task, "q", "c", ["a"], meta))


def test_registered_with_their_options():
    assert {"rloo", "reinforce_pp", "reinforce_pp_baseline"} <= set(advantage_names())
    assert "gspo" in loss_names()
    assert advantage_options("rloo").__name__ == "RLOOOptions"
    assert advantage_options("reinforce_pp_baseline").__name__ == "ReinforcePPOptions"
    assert loss_options("gspo").__name__ == "GSPOOptions"


def test_rloo_leave_one_out():
    # group a = [1, 0, 0, 1]: each minus the mean of the other three: 1 - 1/3 = 2/3, 0 - 2/3 = -2/3
    # group b = [0, 3]: 0 - 3 = -3, 3 - 0 = 3; group c = [5] alone: A = r = 5
    got = rloo_advantages([1, 0, 0, 1, 0, 3, 5], ["a", "a", "a", "a", "b", "b", "c"])
    assert got == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, -3, 3, 5])


def test_rloo_estimator_split_credit():
    # [1, 0]: A = 1, -1; split over 2 segments: 0.5 each, -0.5 each
    g = group("t", [1.0, 0.0], tokens=(1, 1))
    assert compute_group_advantages([g], "rloo", credit="split") == [[[0.5, 0.5], [-0.5, -0.5]]]


def test_token_whiten_weights_by_tokens():
    # values 1 on 3 tokens, 0 on 1 token: N = 4, mu = 3/4; unbiased var = (3 * (1/4)^2 + (3/4)^2) / 3
    # = (3/16 + 9/16) / 3 = 1/4 -> std 1/2: (1 - 0.75) / 0.5 = 0.5, (0 - 0.75) / 0.5 = -1.5
    assert token_whiten([1.0, 0.0], [3, 1], eps=0.0) == pytest.approx([0.5, -1.5])
    with pytest.raises(ValueError, match="at least 2 trained tokens"):
        token_whiten([1.0], [1])


def test_reinforce_pp_whitens_outcomes_over_the_batch_tokens():
    # two groups, no group baseline: rewards 1 (2 rows x 1 token = 2 tokens), 0 (2 tokens); 2 (1 token), 0 (1 token)
    # token values: 1,1,0,0,2,0: N = 6, mu = 4/6 = 2/3; squares: 2*(1/3)^2 + 3*(2/3)^2 + (4/3)^2
    # = 2/9 + 12/9 + 16/9 = 30/9; var = (30/9) / 5 = 2/3; std = sqrt(2/3)
    g1 = group("a", [1.0, 0.0], tokens=(1, 1))
    g2 = group("b", [2.0, 0.0], tokens=(1,))
    got = compute_group_advantages([g1, g2], "reinforce_pp")
    s = math.sqrt(2 / 3 + 1e-8)
    assert got[0] == [[pytest.approx((1 - 2 / 3) / s)] * 2, [pytest.approx((0 - 2 / 3) / s)] * 2]
    assert got[1] == [[pytest.approx((2 - 2 / 3) / s)], [pytest.approx((0 - 2 / 3) / s)]]


def test_reinforce_pp_baseline_centres_per_group_then_whitens():
    # group a = [1, 0] -> centred [0.5, -0.5], each trajectory 2 tokens (one row of 2);
    # group b = [3] alone -> mean 0 -> 3, on 1 token. Token values: .5,.5,-.5,-.5,3: N = 5, mu = 3/5 = 0.6
    # squares: 2*(0.1)^2 + 2*(1.1)^2 + 2.4^2 = 0.02 + 2.42 + 5.76 = 8.2; var = 8.2 / 4 = 2.05
    ga = group("a", [1.0, 0.0], tokens=(2,))
    gb = group("b", [3.0], tokens=(1,))
    got = compute_group_advantages([ga, gb], "reinforce_pp_baseline", whiten_eps=0.0)
    s = math.sqrt(2.05)
    assert got == [[[pytest.approx(-0.1 / s)], [pytest.approx(-1.1 / s)]], [[pytest.approx(2.4 / s)]]]


def test_grpo_task_std_pools_the_task_kind():
    # groups g1 = [1, 0] and g2 = [1, 1] of kind "qa", g3 = [0, 2] of kind "mc"
    # qa: rewards 1, 0, 1, 1: mean 0.75, unbiased var = (3 * 0.0625 + 0.5625) / 3 = 0.25, std 0.5
    # mc: 0, 2: mean 1, var 2, std sqrt 2. Means per group: 0.5, 1, 1.
    got = grpo_task_advantages([1, 0, 1, 1, 0, 2], ["g1", "g1", "g2", "g2", "g3", "g3"],
                               ["qa", "qa", "qa", "qa", "mc", "mc"], eps=0.0)
    assert got == pytest.approx([1.0, -1.0, 0.0, 0.0, -1 / math.sqrt(2), 1 / math.sqrt(2)])


def test_grpo_estimator_task_std_reads_the_task_meta():
    gs = [group("t1", [1.0, 0.0], source="qa"), group("t2", [1.0, 1.0], source="qa"),
          group("t3", [0.0, 2.0], source="mc")]
    got = compute_group_advantages(gs, "grpo", norm_by_std=True, std_over="task", eps=0.0)
    assert [a[0] for per in got for a in per] == pytest.approx([1.0, -1.0, 0.0, 0.0, -1 / math.sqrt(2),
                                                                1 / math.sqrt(2)])
    # group std instead: t1 = [1, 0] has std sqrt(0.5): 0.5 / 0.7071 = 0.7071
    got = compute_group_advantages(gs[:1], "grpo", norm_by_std=True, eps=0.0)
    assert got[0][0][0] == pytest.approx(0.5 / math.sqrt(0.5))
    with pytest.raises(ValueError, match=r"task t1 has no meta\['data_source'\]"):
        compute_group_advantages([group("t1", [1.0, 0.0])], "grpo", norm_by_std=True, std_over="task")


def test_config_refusals():
    with pytest.raises(ConfigError, match="algorithm.loss=gspo takes algorithm.loss_agg=seq-mean-token-mean"):
        load_config(TrainConfig, ["algorithm.loss=gspo", "model.path=x"]).check()
    with pytest.raises(ConfigError, match="algorithm.n must be >= 2 with algorithm.grpo.std_over=task"):
        load_config(TrainConfig, ["algorithm.n=1", "algorithm.grpo.norm_by_std=true", "algorithm.grpo.std_over=task",
                                  "model.path=x"]).check()
    with pytest.raises(ConfigError, match="std_over"):
        load_config(TrainConfig, ["algorithm.grpo.std_over=batch", "model.path=x"])


def test_gspo_two_rows_of_different_lengths_value_and_gradient():
    # row 0: 2 trained tokens, log-ratios 0.1 and -0.3 -> mean -0.1, s0 = e^-0.1 = 0.904837; A = +1
    #   clip range [1 - 0.2, 1 + 0.2] = [0.8, 1.2]: s0 inside, token loss = -A * s0 = -0.904837 on both tokens
    # row 1: 3 trained tokens (last column masked), log-ratios 0.3, 0.3, 0.3 -> s1 = e^0.3 = 1.349859; A = +2
    #   clipped at 1.2: max(-2 * 1.349859, -2 * 1.2) = -2.4 on each token; its gradient is 0
    old = torch.zeros(2, 4)
    new = torch.tensor([[0.1, -0.3, 0.0, 0.0], [0.3, 0.3, 0.3, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, 2.0])
    per_tok, stats = gspo_loss(new, old, adv, mask, seq_clip_low=0.2, seq_clip_high=0.2)
    s0, s1 = math.exp(-0.1), math.exp(0.3)
    assert s1 > 1.2  # row 1 is clipped above
    assert per_tok.detach().tolist() == [pytest.approx([-s0, -s0, 0, 0]), pytest.approx([-2.4, -2.4, -2.4, 0])]
    # clipfrac: row 1's 3 tokens of 5 trained; approx_kl = mean(old - new) = -(0.1 - 0.3 + 0.9) / 5 = -0.14
    assert stats["clipfrac"] == pytest.approx(3 / 5)
    assert stats["approx_kl"] == pytest.approx(-0.14)
    # seq-mean-token-mean: weights 1 / (2 rows * 2 tokens) = 0.25 on row 0, 1 / (2 * 3) on row 1
    w = torch.tensor(loss_token_weights(mask.tolist(), mode="seq-mean-token-mean"))
    total = (w * per_tok).sum()
    assert total.item() == pytest.approx(0.5 * -s0 + 0.5 * -2.4)
    total.backward()
    # d/d new_t of -A * s_t (s_t = sg[s] * exp(new_t - sg[new_t])) is -A * s0 per token: times 0.25 -> -0.25 * s0
    # = GSPO's -A * s * (1/|y|) * grad log pi over R = 2 rows; the clipped row and masked tokens get 0
    assert new.grad.tolist() == [pytest.approx([-0.25 * s0, -0.25 * s0, 0, 0]), pytest.approx([0, 0, 0, 0])]


def test_gspo_negative_advantage_clips_low():
    # one row, log-ratio -0.5 on one token: s = e^-0.5 = 0.60653 < 1 - 0.2; A = -1:
    # max(-(-1) * 0.60653, -(-1) * 0.8) = 0.8 (clipped), gradient 0
    new = torch.tensor([[-0.5]], requires_grad=True)
    per_tok, stats = gspo_loss(new, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 0.2, 0.2)
    assert per_tok.item() == pytest.approx(0.8)
    per_tok.sum().backward()
    assert new.grad.item() == 0.0
    assert stats["clipfrac"] == 1.0
