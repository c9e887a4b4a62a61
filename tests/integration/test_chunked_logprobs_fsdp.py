"""trainer.logits_chunk_tokens under FSDP2 (2 ranks on gloo): the chunked path goes through the sharded root's
own forward, so the embedding / lm_head are gathered and their gradients reduce-scattered, and the update's
loss and gradients equal the full-logits path's and the unsharded module's (float32; tolerances of
tests/unit/test_chunked_logprobs.py). No fallback is counted."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from memrl.training.ranks import distributed as D
from memrl.training.update import chunked_logprobs as C
from memrl.training.update.packing import collate, weigh
from memrl.training.update.policy import ppo_micro_loss
from memrl.types import Segment

pytestmark = pytest.mark.slow


def _step(model, mb, chunk: int) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    ref = torch.full(mb.targets.shape, -2.0)
    part = ppo_micro_loss(model, mb, 0.7, ref_logprobs=ref, kl_coef=0.1, entropy_coef=0.01, chunk_tokens=chunk)
    (part.loss * D.world_size()).backward()  # FSDP averages over ranks; both ranks train the same rows here
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
             for n, p in model.named_parameters()}
    return float(part.loss.detach()), grads


def _rank_main(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    D.init_group(D.DistInfo(rank, 2, "127.0.0.1", port))
    torch.manual_seed(0)
    plain = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    sharded = D.shard_model(copy.deepcopy(plain))
    rows = [Segment([5, 6, 7, 8, 9, 10], [11, 12, 13], [-1.0] * 3, loss_mask=[1, 1, 0], advantage=0.5, trajectory_id="a"),
            Segment([5, 6, 7], [20, 21, 22, 23], [-2.0] * 4, loss_mask=[1] * 4, advantage=-1.0, trajectory_id="b")]
    batch = weigh(rows, "token-mean")
    mb = collate(batch.segments, batch.weights)
    got = {"plain": _step(plain, mb, 0), "full": _step(sharded, mb, 0), "chunked": _step(sharded, mb, 5),
           "fallbacks": sum(C.fallbacks.values())}
    if rank == 0:
        torch.save(got, out)
    D.leave_group()


def test_chunked_logprobs_under_fsdp2_equal_full_logits(tmp_path):
    out = str(tmp_path / "rank0.pt")
    mp.start_processes(_rank_main, args=(D.free_port(), out), nprocs=2, start_method="spawn")
    got = torch.load(out, weights_only=False)
    assert got["fallbacks"] == 0
    for mode in ("full", "chunked"):
        loss, grads = got[mode]
        assert loss == pytest.approx(got["plain"][0], rel=1e-5, abs=1e-7), mode
        for name, g in got["plain"][1].items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=f"{mode} {name}")
