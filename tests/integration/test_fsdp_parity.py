"""FSDP2 on gloo: 2 ranks give the single-process update, and checkpoints move between world sizes.

One spawn of 2 processes checks: (a) global loss weights of every loss_agg mode equal the whole-batch
weights; (b) one update on batch 1 equals world size 1 (loss, grad norm, weights); (c) a checkpoint
written at world size 1 resumes at world size 2 and one written at world size 2 resumes at world
size 1, both landing on the weights of an uninterrupted world-size-1 run after batch 2.
Tolerances (float32, CPU): loss 1e-6, grad norm 3e-5 relative (measured 7e-6), weights 1e-5 absolute (measured
differences: loss ~2e-7, weights ~1e-6 after AdamW; notes/scaleout.md).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.multiprocessing as mp

from memrl.algorithms.losses import AGG_MODES, loss_token_weights
from memrl.config import load_config
from memrl.training import distributed as D
from memrl.training.config import TrainConfig
from memrl.training.packing import Row

pytestmark = pytest.mark.slow

LOSS_TOL, GN_RTOL, W_TOL = 1e-6, 3e-5, 1e-5


def _rows(seed: int, vocab: int) -> list[Row]:
    """9 rows of uneven lengths over 4 trajectories, random tokens, old logprobs and advantages."""
    rng = random.Random(seed)
    rows = []
    for i in range(9):
        p, n = rng.randint(3, 20), rng.randint(1, 12)
        mask = [1 if rng.random() < 0.85 else 0 for _ in range(n)]
        rows.append(Row([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)], mask,
                        [-rng.uniform(0.5, 9.0) for _ in range(n)], rng.uniform(-1, 1), f"t{i % 4}"))
    return rows


def _cfg(model: str, out: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01",
        "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=60", "trainer.progress=false",
    ])


def _rank_main(rank: int, model: str, tmp: str, port: int, vocab: int) -> None:
    torch.set_num_threads(1)
    from memrl.training.workers import PolicyWorker

    info = D.DistInfo(rank, 2, "127.0.0.1", port)
    D.init_group(info)
    # (a) global normalizers: this rank's weights equal the whole-batch weights of its rows, every mode
    rows = _rows(1, vocab)
    share = D.split_rows(rows, 2)
    for mode in AGG_MODES:
        full = loss_token_weights([r.loss_mask for r in rows], [r.trajectory_id for r in rows], mode)
        mine = [Row(**{**rows[i].__dict__}) for i in share[rank]]
        D.set_global_loss_weights(mine, mode)
        for i, r in zip(share[rank], mine, strict=True):
            assert r.weights == full[i], (mode, i)
    out: dict[str, object] = {}
    cfg = _cfg(model, tmp)
    w = PolicyWorker(cfg, info)
    out["m1"] = w.train_rows(_rows(1, vocab))
    out["w1"] = w.full_state()
    w.save(os.path.join(tmp, "ck2"), 1, {"step": 1, "data_position": 0})
    out["m2"] = w.train_rows(_rows(2, vocab))
    out["w2"] = w.full_state()
    # (c) resume at world size 2 from the world-size-1 checkpoint, then batch 2
    w12 = PolicyWorker(cfg, info, start=os.path.join(tmp, "ck1", "step_000001"))
    out["m12"] = w12.train_rows(_rows(2, vocab))
    out["w12"] = w12.full_state()
    if rank == 0:
        torch.save(out, os.path.join(tmp, "rank0.pt"))
    w.close()


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_two_ranks_equal_one_and_checkpoints_cross_world_sizes(tmp_path):
    from memrl.models.tiny import cached_tiny_model
    from memrl.training.workers import PolicyWorker

    model = str(cached_tiny_model("tiny"))
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    cfg = _cfg(model, str(tmp_path))
    w = PolicyWorker(cfg)
    base = w.full_state()
    m1 = w.train_rows(_rows(1, vocab))
    w1 = w.full_state()
    w.save(str(tmp_path / "ck1"), 1, {"step": 1, "data_position": 0})
    m2 = w.train_rows(_rows(2, vocab))
    w2 = w.full_state()

    mp.spawn(_rank_main, args=(model, str(tmp_path), D.free_port(), vocab), nprocs=2, join=True)
    got = torch.load(tmp_path / "rank0.pt", weights_only=True)

    assert _close(base, w1) > 1e-4  # the step really moved the weights
    for m_ref, m_got in ((m1, got["m1"]), (m2, got["m2"]), (m2, got["m12"])):
        assert abs(m_ref["loss/total"] - m_got["loss/total"]) < LOSS_TOL
        assert abs(m_ref["loss/kl"] - m_got["loss/kl"]) < LOSS_TOL
        assert abs(m_ref["train/grad_norm"] - m_got["train/grad_norm"]) <= GN_RTOL * m_ref["train/grad_norm"]
        assert (m_got["train/rows"], m_got["train/tokens"]) == (m_ref["train/rows"], m_ref["train/tokens"])
    assert _close(w1, got["w1"]) < W_TOL
    assert _close(w2, got["w2"]) < W_TOL
    assert _close(w2, got["w12"]) < W_TOL  # 1 -> 2
    # 2 -> 1: the world-size-2 checkpoint resumes in one process onto the same weights
    w21 = PolicyWorker(cfg, start=str(tmp_path / "ck2" / "step_000001"))
    assert _close(w21.full_state(), got["w1"]) == 0.0
    m21 = w21.train_rows(_rows(2, vocab))
    assert abs(m21["loss/total"] - m2["loss/total"]) < LOSS_TOL
    assert _close(w2, w21.full_state()) < W_TOL
