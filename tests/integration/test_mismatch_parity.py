"""The train/inference mismatch metrics (mismatch/<engine>/*, docs/guides/async.md) are token sums reduced over
micro-batches and FSDP ranks: 2 gloo ranks report what one process reports for the same mini-batch.

The token count is exact. The means compare float32 logprobs of the same rows computed in differently
padded micro-batches on different ranks, so they could differ by float32 rounding (measured on this batch:
abs diff and share bit-identical, k3 differs in the last bit of its float64 sum;
asserted: 1e-6, the loss tolerance of tests/integration/test_fsdp_parity.py)."""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.multiprocessing as mp

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks import distributed as D
from memrl.training.update.packing import TrainBatch, split, weigh
from memrl.types import Segment

pytestmark = pytest.mark.slow

KEYS = ("abs_logprob_diff_mean", "kl_k3", "ratio_outside_share")


def _rows(vocab: int, rank: int | None = None) -> TrainBatch:
    """7 rows of uneven lengths, random tokens and engine logprobs (some far from the model's: the share
    outside [1/8, 8] is neither 0 nor 1), weighed over all of them; `rank`: that rank's share of 2."""
    rng = random.Random(5)
    rows = []
    for i in range(7):
        p, n = rng.randint(3, 18), rng.randint(1, 10)
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-rng.uniform(2.0, 10.0) for _ in range(n)],
                            loss_mask=[1 if rng.random() < 0.8 else 0 for _ in range(n)],
                            advantage=rng.uniform(-1, 1), trajectory_id=f"t{i % 3}"))
    batch = weigh(rows, "token-mean")
    return batch if rank is None else split(batch, 2)[rank]


def _cfg(model: str, out: str, mode: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", "algorithm.kl_coef=0", f"algorithm.off_policy={mode}", "algorithm.mismatch_clip=8",
        "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=40", "trainer.progress=false",
    ])


def _rank_main(rank: int, model: str, tmp: str, port: int, vocab: int, mode: str) -> None:
    """One rank of a 2-rank group holding one PolicyWorker, as the other FSDP parity tests do (a group
    per mode: two workers in one group once aborted a rank at exit, under load)."""
    torch.set_num_threads(1)
    from memrl.training.ranks.workers import PolicyWorker

    info = D.DistInfo(rank, 2, "127.0.0.1", port)
    D.init_group(info)
    w = PolicyWorker(_cfg(model, tmp, mode), info)
    got = w.train_rows(_rows(vocab, rank))
    if rank == 0:
        torch.save(got, os.path.join(tmp, f"rank0_{mode}.pt"))
    w.close()


def test_mismatch_metrics_two_ranks_equal_one(tmp_path):
    from transformers import AutoConfig

    from memrl.models.tiny import cached_tiny_model
    from memrl.training.ranks.workers import PolicyWorker

    model = str(cached_tiny_model("tiny"))
    vocab = AutoConfig.from_pretrained(model).vocab_size
    one = {mode: PolicyWorker(_cfg(model, str(tmp_path), mode)).train_rows(_rows(vocab)) for mode in ("none", "tis")}
    for mode in ("none", "tis"):
        mp.spawn(_rank_main, args=(model, str(tmp_path), D.free_port(), vocab, mode), nprocs=2, join=True)
    two = {mode: torch.load(tmp_path / f"rank0_{mode}.pt", weights_only=True) for mode in ("none", "tis")}
    trained = sum(sum(s.loss_mask) for s in _rows(vocab).segments)
    for mode in ("none", "tis"):
        a, b = one[mode], two[mode]
        assert a["mismatch/hf/tokens"] == b["mismatch/hf/tokens"] == trained, mode
        for k in KEYS:
            assert abs(a[f"mismatch/hf/{k}"] - b[f"mismatch/hf/{k}"]) < 1e-6, (mode, k)
        assert 0 < a["mismatch/hf/ratio_outside_share"] < 1, mode
        assert abs(a["loss/total"] - b["loss/total"]) < 1e-6, mode
    # the same forward before the step: the mismatch does not depend on the correction
    for k in KEYS:
        assert one["none"][f"mismatch/hf/{k}"] == one["tis"][f"mismatch/hf/{k}"], k
    print({m: {k: (one[m][f"mismatch/hf/{k}"], two[m][f"mismatch/hf/{k}"]) for k in KEYS} for m in one})
