"""algorithm.old_logprobs=trainer on a real tiny model: the recompute is the policy's own teacher-forced
logprobs, the first of two mini-batches then has a PPO ratio of 1 (to float tolerance: the recompute packs
all four rows into one micro-batch, the update its two), the second is taken against the same pre-update
logprobs after the first optimizer step moved the policy; the engine's logprobs (here a perturbed -3.0 on
every token) enter only the mismatch metrics. Without the recompute the ratio is against the engine's."""

from __future__ import annotations

import pytest
import torch

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks.workers import build_workers
from memrl.training.update.packing import collate, weigh
from memrl.training.update.policy import token_logprobs
from memrl.types import Segment

pytestmark = pytest.mark.slow

ENGINE_LP = -3.0


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _cfg(model: str) -> TrainConfig:
    return load_config(TrainConfig, [f"model.path={model}", "algorithm.kl_coef=0", "algorithm.old_logprobs=trainer",
                                     "optim.lr=1e-2", "optim.warmup_steps=0", "trainer.token_budget=4096"])


def _rows() -> list[Segment]:
    """Four rows of 6 prompt + 5 response tokens; advantages +1, -1, +1, -1; the engine's logprobs -3.0."""
    out = []
    for i in range(4):
        prompt = [(7 * i + k) % 50 + 5 for k in range(6)]
        resp = [(11 * i + 3 * k) % 50 + 5 for k in range(5)]
        out.append(Segment(prompt, resp, [ENGINE_LP] * 5, advantage=1.0 if i % 2 == 0 else -1.0,
                           trajectory_id=f"t{i}"))
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_two_mini_batches_take_the_ratio_against_the_recompute(tiny_path):
    cfg = _cfg(tiny_path)
    rows = _rows()
    workers = build_workers(cfg)
    try:
        old = workers.old_logprobs(rows)
        for s, lp in zip(rows, old, strict=True):  # each row alone, teacher-forced: the same values
            with torch.no_grad():
                alone, _ = token_logprobs(workers.model, collate([s]), cfg.algorithm.temperature)
            assert alone[0, 5:10].tolist() == pytest.approx(lp, abs=1e-5)
            s.old_logprobs = lp
        first = workers.train_rows(weigh(rows[:2], "token-mean"), step_scheduler=False)
        # ratio 1 on every token: no clipping, approx_kl = mean(old - current) = 0, and the pairs say so
        assert first["loss/approx_kl"] == pytest.approx(0.0, abs=1e-6) and first["loss/clipfrac"] == 0.0
        assert first["mismatch/current_vs_old/abs_logprob_diff_mean"] < 1e-5
        engine_gap = _mean([abs(x - ENGINE_LP) for lp in old[:2] for x in lp])
        assert first["mismatch/old_vs_engine/abs_logprob_diff_mean"] == pytest.approx(engine_gap, abs=1e-5)
        second = workers.train_rows(weigh(rows[2:], "token-mean"))
        # the second mini-batch: the same pre-update logprobs, a policy one optimizer step further
        assert second["mismatch/current_vs_old/abs_logprob_diff_mean"] > 1e-3
        assert abs(second["loss/approx_kl"]) > 1e-6
    finally:
        workers.close()

    # the engine's ratio (algorithm.old_logprobs=engine): the same first mini-batch on a fresh policy is
    # taken against -3.0, so approx_kl = mean(engine - current) over its 10 tokens, and most tokens clip
    fresh = build_workers(cfg)
    try:
        got = fresh.train_rows(weigh(_rows()[:2], "token-mean"), step_scheduler=False)
    finally:
        fresh.close()
    want = _mean([ENGINE_LP - x for lp in old[:2] for x in lp])
    assert got["loss/approx_kl"] == pytest.approx(want, abs=1e-5) and abs(want) > 0.5
    assert got["loss/clipfrac"] > 0.5
    assert "mismatch/old_vs_engine/abs_logprob_diff_mean" not in got
