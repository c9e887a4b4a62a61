"""Ulysses sequence parallelism on gloo: 2 ranks sharing every row by sequence give the 1-rank update.

One spawn of 2 processes (trainer.sequence_parallel=2, so one block and data-parallel size 1) runs, for
each model, the recompute of old log-probs and optimizer steps on rows whose trained tokens straddle the
shard boundary (odd lengths: the last shard is padded), several rows per micro-batch: (a) tiny Qwen2
(4 heads, 2 KV heads: KV heads split), 2 steps (the second with a nonzero KL to the reference, whose
forward is sharded too), old log-probs again after them; (b) tiny-qwen3 (q/k norms), 1 step; (c) a random
Qwen2 with 1 KV head (repeated to each rank) and gradient checkpointing (the recompute all-to-alls in the
backward), 1 step. A second spawn of 4 processes (2 blocks of S = 2: data-parallel size 2) runs (a) with each
block its share of the rows. Each is compared with world size 1: loss sums, counts, gradients (before the
optimizer, no clipping), grad norm, weights after AdamW, old log-probs.
Tolerances (float32, CPU; measured in brackets): loss sums 1e-6 absolute [4e-7]; gradients at the first
step 1e-7 absolute [2.3e-8; the largest ~0.04], at the second 3e-6 [1e-6: the weights then differ by the
first step's]; grad norm 3e-5 relative [7e-6, as FSDP2 at 2 ranks without SP]; weights after AdamW 1e-4
absolute [5e-5: Adam's first step g / (|g| + eps) turns float noise on gradients near 1e-8 into a sizeable
part of lr = 1e-3]; old log-probs of the trained tokens 1e-5 before the steps [1e-6], 5e-5 after [1e-5].
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.multiprocessing as mp

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks import distributed as D
from memrl.training.update.packing import split, split_rows, weigh
from memrl.types import Segment

pytestmark = pytest.mark.slow

LOSS_TOL, GN_RTOL, W_TOL = 1e-6, 3e-5, 1e-4
GRAD_TOL = (1e-7, 3e-6)
"""Gradients at the first step (same weights), and at the second (after one AdamW step each)."""
LP_TOL = {"olp": 1e-5, "olp_after": 5e-5}
SP = 2
CASES = {"qwen2": ("tiny", 2, False, 0), "qwen3": ("tiny-qwen3", 1, False, 7), "qwen2_1kv": ("mqa", 1, True, 0)}
"""name: (model, optimizer steps, gradient checkpointing, trainer.logits_chunk_tokens). The qwen3 case takes
its log-probabilities 7 tokens at a time (memrl.training.update.chunked_logprobs) in both runs: a shard's last
position then predicts the next shard's first token through the chunked path too."""
SUMS = ("loss/total", "loss/pg_loss", "loss/kl", "loss/entropy", "loss/clipfrac", "loss/approx_kl",
        "mismatch/hf/abs_logprob_diff_mean", "mismatch/hf/kl_k3")
COUNTS = ("train/rows", "train/tokens", "mismatch/hf/tokens")


def _rows(seed: int, vocab: int) -> list[Segment]:
    rng = random.Random(seed)
    rows = []
    for i in range(6):
        p, n = rng.randint(4, 30), rng.randint(3, 30)
        mask = [1 if rng.random() < 0.85 else 0 for _ in range(n)]
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-rng.uniform(0.5, 9.0) for _ in range(n)], loss_mask=mask, advantage=rng.uniform(-1, 1),
                            trajectory_id=f"t{i % 3}"))
    return rows


def _cfg(model: str, out: str, sp: int, checkpointing: bool, workers: int, chunk: int = 0) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01",
        "optim.lr=1e-3", "optim.warmup_steps=0", "optim.grad_clip=0", "trainer.token_budget=40",
        "trainer.progress=false", f"trainer.num_workers={workers}", f"trainer.sequence_parallel={sp}",
        "rollout.num_engines=1", f"model.gradient_checkpointing={str(checkpointing).lower()}",
        f"trainer.logits_chunk_tokens={chunk}"])


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient (gathered from FSDP2's shards: collective)."""
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters()}


def _run(model: str, out: str, sp: int, steps: int, checkpointing: bool, chunk: int, vocab: int,
         info: D.DistInfo = D.DistInfo()) -> dict:
    """This rank's results; its block's share of each batch as the driver cuts it (RankGroup: data-parallel
    size world / sp). Old log-probs: {row index: log-probs} of the rows of its block's share."""
    from memrl.training.ranks.workers import PolicyWorker

    dp, block = info.world_size // sp, info.rank // sp
    w = PolicyWorker(_cfg(model, out, sp, checkpointing, info.world_size, chunk), info)
    mine = split_rows(_rows(0, vocab), dp)[block]

    def olp() -> dict[int, list[float]]:
        return dict(zip(mine, w.old_logprobs([_rows(0, vocab)[i] for i in mine]), strict=True))

    got: dict = {"olp": olp()}
    for step in range(1, steps + 1):
        got[f"m{step}"] = w.train_rows(split(weigh(_rows(step, vocab), "token-mean"), dp)[block])
        got[f"g{step}"] = _grads(w.model)
    got["w"] = w.full_state()
    got["olp_after"] = olp()
    return got


def _rank_main(rank: int, models: dict[str, str], cases: dict, world: int, tmp: str, port: int, vocab: int) -> None:
    torch.set_num_threads(1)
    info = D.DistInfo(rank, world, "127.0.0.1", port)
    D.init_group(info)
    out = {name: _run(models[name], tmp, SP, steps, ckpt, chunk, vocab, info)
           for name, (_, steps, ckpt, chunk) in cases.items()}
    if rank == 0:
        torch.save(out, os.path.join(tmp, "rank0.pt"))
    D.leave_group()


def _one_kv_head_model(tmp: str) -> str:
    """A random Qwen2 of tiny's shape with 1 KV head (fewer KV heads than ranks), tiny's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    src = cached_tiny_model("tiny")
    cfg = AutoConfig.from_pretrained(src)
    cfg.num_key_value_heads = 1
    torch.manual_seed(0)
    path = os.path.join(tmp, "one_kv")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    AutoTokenizer.from_pretrained(src).save_pretrained(path)
    return path


def _trained(vocab: int) -> list[list[int]]:
    """The loss masks of _rows(0): old log-probs are compared on trained tokens only. The others are not
    used, and token_logprobs leaves those before a micro-batch's first trained column at 0: a shard starts
    that column count at its own first column, so it zeroes more of them than the whole row does."""
    return [list(row.loss_mask) for row in _rows(0, vocab)]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _compare(ref: dict, got: dict, cases: dict, vocab: int) -> None:
    for name, (_, steps, _, _) in cases.items():
        r, g = ref[name], got[name]
        for step in range(1, steps + 1):
            m_ref, m_got = r[f"m{step}"], g[f"m{step}"]
            for k in SUMS:
                assert abs(m_ref[k] - m_got[k]) < LOSS_TOL, (name, step, k, m_ref[k], m_got[k])
            for k in COUNTS:
                assert m_ref[k] == m_got[k], (name, step, k)
            assert abs(m_ref["train/grad_norm"] - m_got["train/grad_norm"]) <= GN_RTOL * m_ref["train/grad_norm"]
            assert _max_diff(r[f"g{step}"], g[f"g{step}"]) < GRAD_TOL[step - 1], (name, step)
            assert _max_diff(r[f"g{step}"], {k: 0 * v for k, v in g[f"g{step}"].items()}) > 1e-3  # not all zero
        if steps == 2:
            assert m_ref["loss/kl"] > 1e-6  # the reference's forward counts
        assert _max_diff(r["w"], g["w"]) < W_TOL, name
        trained = _trained(vocab)
        for key in ("olp", "olp_after"):  # on the trained tokens (see _trained), of the rows rank 0's block holds
            assert g[key]
            diff = [abs(a - b) for i, lp in g[key].items() for a, b, m in zip(r[key][i], lp, trained[i], strict=True) if m]
            assert max(diff) < LP_TOL[key], (name, key)


def _models(tmp: str, cases: dict) -> dict[str, str]:
    from memrl.models.tiny import cached_tiny_model

    return {name: _one_kv_head_model(tmp) if m == "mqa" else str(cached_tiny_model(m)) for name, (m, _, _, _) in cases.items()}


def _vocab(models: dict[str, str]) -> int:
    from transformers import AutoConfig

    return min(AutoConfig.from_pretrained(p).vocab_size for p in models.values())


def test_sequence_parallel_two_ranks_equal_one(tmp_path):
    models = _models(str(tmp_path), CASES)
    vocab = _vocab(models)
    ref = {name: _run(models[name], str(tmp_path), 1, steps, ckpt, chunk, vocab)
           for name, (_, steps, ckpt, chunk) in CASES.items()}
    mp.spawn(_rank_main, args=(models, CASES, SP, str(tmp_path), D.free_port(), vocab), nprocs=SP, join=True)
    _compare(ref, torch.load(tmp_path / "rank0.pt", weights_only=True), CASES, vocab)


def test_sequence_parallel_with_data_parallel_four_ranks_equal_one(tmp_path):
    """4 ranks: 2 blocks of S = 2 (data-parallel size 2), each block its token-balanced share of the rows:
    FSDP2 averages over all 4 ranks, the blocks' ranks see the same rows, and nothing is counted twice."""
    cases = {"qwen2": CASES["qwen2"]}
    models = _models(str(tmp_path), cases)
    vocab = _vocab(models)
    ref = {name: _run(models[name], str(tmp_path), 1, steps, ckpt, chunk, vocab)
           for name, (_, steps, ckpt, chunk) in cases.items()}
    mp.spawn(_rank_main, args=(models, cases, 2 * SP, str(tmp_path), D.free_port(), vocab), nprocs=2 * SP, join=True)
    _compare(ref, torch.load(tmp_path / "rank0.pt", weights_only=True), cases, vocab)
