"""FSDP2 on gloo: 2 ranks give the single-process update, and checkpoints move between world sizes.

One spawn of 2 processes checks: (a) the driver's split hands each rank its token-balanced share of the
rows with the whole batch's weights, every loss_agg mode; (b) one update on batch 1 equals world size 1 (loss, grad norm, weights); (c) checkpoints (HF
weights + DCP optimizer shards) resume 1 -> 2, 2 -> 1 and 2 -> 2 with the saved weights and optimizer
state bit-identical, 2 -> 2 then trains bit-identically to the uninterrupted run, 1 -> 2 and 2 -> 1
land on the uninterrupted world-size-1 weights after batch 2 (tolerance below); (d) checkpoints of the
older layout (whole optimizer state in trainer_state.pt, keyed by name or by index) still resume.
Tolerances (float32, CPU): loss 1e-6, grad norm 3e-5 relative (measured 7e-6), weights 1e-5 absolute (measured
differences: loss ~2e-7, weights ~1e-6 after AdamW; notes/scaleout.md).
"""

from __future__ import annotations

import copy
import os
import random
import shutil

import pytest
import torch
import torch.multiprocessing as mp

from memrl.algorithms.losses import AGG_MODES, row_weights
from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks import distributed as D
from memrl.training.update.packing import TrainBatch, split, split_rows, weigh
from memrl.types import Segment

pytestmark = pytest.mark.slow

LOSS_TOL, GN_RTOL, W_TOL = 1e-6, 3e-5, 1e-5


def _segments(seed: int, vocab: int) -> list[Segment]:
    """9 rows of uneven lengths over 4 trajectories, random tokens, old logprobs and advantages."""
    rng = random.Random(seed)
    rows = []
    for i in range(9):
        p, n = rng.randint(3, 20), rng.randint(1, 12)
        mask = [1 if rng.random() < 0.85 else 0 for _ in range(n)]
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-rng.uniform(0.5, 9.0) for _ in range(n)], loss_mask=mask, advantage=rng.uniform(-1, 1),
                            trajectory_id=f"t{i % 4}"))
    return rows


def _rows(seed: int, vocab: int, rank: int | None = None) -> TrainBatch:
    """The batch weighed over all 9 rows (loss_agg token-mean, the default); `rank`: that rank's share of 2."""
    batch = weigh(_segments(seed, vocab), "token-mean")
    return batch if rank is None else split(batch, 2)[rank]


def _cfg(model: str, out: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01",
        "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=60", "trainer.progress=false",
    ])


def _same_optim(a: dict, b: dict) -> None:
    """Bit-identical optimizer states (name-keyed), param groups included."""
    assert a["state"].keys() == b["state"].keys()
    for name, st in a["state"].items():
        assert st.keys() == b["state"][name].keys(), name
        for k, v in st.items():
            assert torch.equal(v, b["state"][name][k]), (name, k)
    def plain(groups: list[dict]) -> list[dict]:  # the gather at world size 2 hands tuples back as lists
        return [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in groups]

    assert plain(a["param_groups"]) == plain(b["param_groups"])


def _legacy(src: str, dst: str, optimizer: dict) -> str:
    """A copy of checkpoint `src` in the older layout: the optimizer dict inside trainer_state.pt."""
    from memrl.training.checkpoints.checkpoint import OPTIM_DIR, STATE_FILE

    shutil.copytree(src, dst)
    shutil.rmtree(os.path.join(dst, OPTIM_DIR))
    state = torch.load(os.path.join(dst, STATE_FILE), weights_only=True)
    state.pop("optimizer_layout")
    state.pop("optimizer_groups")
    torch.save(dict(state, optimizer=optimizer), os.path.join(dst, STATE_FILE))
    return dst


def _rank_main(rank: int, model: str, tmp: str, port: int, vocab: int) -> None:
    torch.set_num_threads(1)
    from memrl.training.ranks.workers import PolicyWorker

    info = D.DistInfo(rank, 2, "127.0.0.1", port)
    D.init_group(info)
    # (a) this rank's share: its rows of the batch, each with the whole batch's weight, every mode
    rows = _segments(1, vocab)
    share = split_rows(rows, 2)
    for mode in AGG_MODES:
        full = row_weights([r.loss_mask for r in rows], [r.trajectory_id for r in rows], mode)
        mine = split(weigh(rows, mode), 2)[rank]
        assert mine.segments == [rows[i] for i in share[rank]] and mine.batch_rows == 9, mode
        assert mine.weights == [full[i] for i in share[rank]], mode
    out: dict[str, object] = {}
    cfg = _cfg(model, tmp)
    w = PolicyWorker(cfg, info)
    out["m1"] = w.train_rows(_rows(1, vocab, rank))
    out["w1"] = w.full_state()
    out["o1"] = D.full_optim_state(w.model, w.opt)
    w.save(os.path.join(tmp, "ck2"), 1, {"step": 1, "data_position": 0})
    out["m2"] = w.train_rows(_rows(2, vocab, rank))
    out["w2"] = w.full_state()
    # (c) 2 -> 2: the saved weights and optimizer state come back bit-identical, and so does batch 2
    w22 = PolicyWorker(cfg, info, start=os.path.join(tmp, "ck2", "step_000001"))
    out["w22_start"], out["o22_start"] = w22.full_state(), D.full_optim_state(w22.model, w22.opt)
    out["m22"] = w22.train_rows(_rows(2, vocab, rank))
    out["w22"] = w22.full_state()
    # 1 -> 2, then batch 2; and (d) the older layout at world size 2
    w12 = PolicyWorker(cfg, info, start=os.path.join(tmp, "ck1", "step_000001"))
    out["w12_start"], out["o12_start"] = w12.full_state(), D.full_optim_state(w12.model, w12.opt)
    out["m12"] = w12.train_rows(_rows(2, vocab, rank))
    out["w12"] = w12.full_state()
    wold = PolicyWorker(cfg, info, start=os.path.join(tmp, "ck1_named"))
    out["oold_start"] = D.full_optim_state(wold.model, wold.opt)
    if rank == 0:
        torch.save(out, os.path.join(tmp, "rank0.pt"))
    w.close()


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_two_ranks_equal_one_and_checkpoints_cross_world_sizes(tmp_path):
    from memrl.models.tiny import cached_tiny_model
    from memrl.training.ranks.workers import PolicyWorker

    model = str(cached_tiny_model("tiny"))
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    cfg = _cfg(model, str(tmp_path))
    w = PolicyWorker(cfg)
    base = w.full_state()
    m1 = w.train_rows(_rows(1, vocab))
    w1 = w.full_state()
    o1 = D.full_optim_state(w.model, w.opt)
    by_index = copy.deepcopy(w.opt.state_dict())
    ck1 = w.save(str(tmp_path / "ck1"), 1, {"step": 1, "data_position": 0})
    assert sorted(os.listdir(os.path.join(ck1, "optimizer"))) == [".metadata", "__0_0.distcp"]
    _legacy(ck1, str(tmp_path / "ck1_named"), o1)
    _legacy(ck1, str(tmp_path / "ck1_index"), by_index)
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
    # 2 -> 2: exact
    assert sorted(os.listdir(tmp_path / "ck2" / "step_000001" / "optimizer")) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its shards
    assert _close(got["w22_start"], got["w1"]) == 0.0
    _same_optim(got["o22_start"], got["o1"])
    assert got["m22"] == got["m2"]
    assert _close(got["w22"], got["w2"]) == 0.0
    # 1 -> 2: the world-size-1 state, resharded, bit-identical; batch 2 within tolerance
    assert _close(got["w12_start"], w1) == 0.0
    _same_optim(got["o12_start"], o1)
    _same_optim(got["oold_start"], o1)
    assert _close(w2, got["w12"]) < W_TOL
    # 2 -> 1: the world-size-2 checkpoint resumes in one process onto the same weights and optimizer state
    w21 = PolicyWorker(cfg, start=str(tmp_path / "ck2" / "step_000001"))
    assert _close(w21.full_state(), got["w1"]) == 0.0
    _same_optim(D.full_optim_state(w21.model, w21.opt), got["o1"])
    m21 = w21.train_rows(_rows(2, vocab))
    assert abs(m21["loss/total"] - m2["loss/total"]) < LOSS_TOL
    assert _close(w2, w21.full_state()) < W_TOL
    # 1 -> 1 and the older layouts at world size 1: exact
    for start in ("ck1/step_000001", "ck1_named", "ck1_index"):
        w11 = PolicyWorker(cfg, start=str(tmp_path / start))
        _same_optim(D.full_optim_state(w11.model, w11.opt), o1)
        assert w11.train_rows(_rows(2, vocab)) == m2, start
        assert _close(w11.full_state(), w2) == 0.0, start
