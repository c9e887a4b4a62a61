"""trainer.logits_chunk_tokens: log-probabilities and entropy from the hidden states, a chunk of tokens' logits
at a time (memrl.training.update.chunked_logprobs), equal the full-logits path's values and gradients.

Tolerances: float32 values 1e-5 absolute and gradients rtol 1e-4 / atol 1e-6 (measured: logprobs equal,
entropy 5e-7, gradients 4e-7 of the largest entry: the same ops on chunks of rows, d/dz written out
instead of autograd's); bfloat16: values 2e-2 and gradients 5e-2 of the largest entry (measured: values
equal, gradients 1.1e-2: bf16 rounds each chunk's weight gradient before the fp32 sum).
"""

from __future__ import annotations

import logging
import math
import random

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoConfig,
    GPT2Config,
    GPT2LMHeadModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from memrl.config import load_config
from memrl.models.tiny import cached_tiny_model
from memrl.training.config import TrainConfig
from memrl.training.ranks.workers import PolicyWorker
from memrl.training.update import chunked_logprobs as C
from memrl.training.update.lora import BaseReference
from memrl.training.update.packing import collate, weigh
from memrl.training.update.policy import ppo_micro_loss, token_logprobs
from memrl.types import Segment

VOCAB = 64


def _model(tied: bool = True, seed: int = 0, dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg).to(dtype).eval()


def _batch(n: int = 5, seed: int = 0):
    """A micro-batch of `n` rows of uneven prompt and response lengths (first trained position > 0)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p, r = rng.randint(3, 12), rng.randint(2, 9)
        rows.append(Segment([rng.randrange(3, VOCAB) for _ in range(p)], [rng.randrange(3, VOCAB) for _ in range(r)],
                            [-rng.random() * 3 for _ in range(r)], loss_mask=[1] * r, advantage=rng.uniform(-1, 1),
                            trajectory_id=f"t{i}"))
    batch = weigh(rows, "token-mean")
    return collate(batch.segments, batch.weights)


def _run(model, mb, temperature: float, chunk: int, seed: int = 1):
    """(logprobs, entropy, gradients) of a loss mixing both with random per-token coefficients."""
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs(model, mb, temperature, with_entropy=True, chunk_tokens=chunk)
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(lp.shape, generator=g), torch.randn(lp.shape, generator=g)
    ((a * lp).sum() + (b * ent).sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads


def _assert_same(got, want, value_tol=1e-5, grad_rtol=1e-4, grad_atol=1e-6):
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=value_tol)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=value_tol)
    assert got[2].keys() == want[2].keys() and got[2]
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=grad_rtol, atol=grad_atol, msg=name)


def test_two_by_three_logits_by_hand():
    """logits [[0, 0, ln 2], [0, 0, 0]] (hidden = unit vectors, weight = the logits' transpose), targets 2, 0:
    p = [1/4, 1/4, 1/2] -> logprob ln(1/2), entropy 1.5 ln 2; uniform -> logprob -ln 3, entropy ln 3.
    At T = 0.5 row 1 is [0, 0, 2 ln 2]: p = [1/6, 1/6, 2/3] -> ln(2/3), entropy ln(6)/3 + (2/3) ln(3/2).
    d logprob / d logits = onehot - p, so the weight's gradient column for row 1 is [-1/4, -1/4, 1/2]."""
    ln2 = math.log(2.0)
    weight = torch.tensor([[0.0, 0.0], [0.0, 0.0], [ln2, 0.0]], requires_grad=True)  # [V=3, H=2]
    hidden = torch.eye(2, requires_grad=True)
    targets = torch.tensor([2, 0])
    for chunk in (1, 2):
        lp, ent = C.ChunkedHeadLogprobs.apply(hidden, weight, None, targets, 1.0, chunk, True)
        torch.testing.assert_close(lp, torch.tensor([-ln2, -math.log(3.0)]))
        torch.testing.assert_close(ent, torch.tensor([1.5 * ln2, math.log(3.0)]))
        weight.grad = None
        lp[0].backward()
        torch.testing.assert_close(weight.grad, torch.tensor([[-0.25, 0.0], [-0.25, 0.0], [0.5, 0.0]]))
    lp, ent = C.ChunkedHeadLogprobs.apply(hidden, weight, None, targets, 0.5, 1, True)
    torch.testing.assert_close(lp[0], torch.tensor(math.log(2 / 3)))
    torch.testing.assert_close(ent[0], torch.tensor(math.log(6.0) / 3 + 2 / 3 * math.log(1.5)))


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunked_equals_full_logits_values_and_gradients(tied, temperature, chunk):
    model = _model(tied)
    mb = _batch()
    assert isinstance(C.split_model(model), C.HeadSplit)  # the chunked path, not a fallback
    got = _run(model, mb, temperature, chunk)
    _assert_same(got, _run(model, mb, temperature, 0))
    assert torch.equal(got[0][:, :2], torch.zeros(got[0].shape[0], 2))  # positions before the first trained one


def test_ppo_loss_with_chunks_equals_full_logits():
    """The update's loss (policy loss, KL, entropy bonus) and its gradients."""
    model = _model()
    mb = _batch(seed=3)
    ref = torch.randn(mb.targets.shape) - 2.0
    results = []
    for chunk in (0, 5):
        model.zero_grad(set_to_none=True)
        part = ppo_micro_loss(model, mb, 0.7, ref_logprobs=ref, kl_coef=0.1, entropy_coef=0.01, chunk_tokens=chunk)
        part.loss.backward()
        results.append((part.loss.detach(), part.sums, [p.grad.clone() for p in model.parameters()]))
    (l0, s0, g0), (l1, s1, g1) = results
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-7)
    assert s1 == pytest.approx(s0, rel=1e-5, abs=1e-7)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_bf16_chunked_is_as_close_to_fp32_as_the_full_path():
    """In bf16 both paths round; each stays as close to the fp32 model's numbers, and to each other."""
    mb = _batch(seed=2)
    exact = _run(_model(), mb, 0.7, 0)
    full = _run(_model(dtype=torch.bfloat16), mb, 0.7, 0)
    chunked = _run(_model(dtype=torch.bfloat16), mb, 0.7, 3)
    torch.testing.assert_close(chunked[0], full[0], rtol=0, atol=2e-2)
    torch.testing.assert_close(chunked[1], full[1], rtol=0, atol=2e-2)
    for name, g in full[2].items():
        scale = float(g.float().abs().max())
        torch.testing.assert_close(chunked[2][name].float(), g.float(), rtol=0, atol=5e-2 * scale, msg=name)
        err_full = float((full[2][name].float() - exact[2][name]).abs().max())
        err_chunked = float((chunked[2][name].float() - exact[2][name]).abs().max())
        assert err_chunked <= 2 * err_full + 1e-3 * scale, name


def test_lora_policy_and_its_base_reference():
    """A PEFT LoRA policy (gradients reach the adapters only) and its adapters-off KL reference."""
    model = get_peft_model(_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
    mb = _batch(seed=4)
    _assert_same(_run(model, mb, 0.7, 6), _run(model, mb, 0.7, 0))
    ref = BaseReference(model)
    model.train()
    with torch.no_grad():
        want, _ = token_logprobs(ref, mb, 0.7)
        got, _ = token_logprobs(ref, mb, 0.7, chunk_tokens=6)
        adapted, _ = token_logprobs(model, mb, 0.7, chunk_tokens=6)
    assert model.training  # the reference's context restores the mode
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert float((adapted - got).abs().max()) > 1e-3  # the adapters were off for the reference


def test_models_it_cannot_split_keep_the_full_logits_logged_and_counted(caplog):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=64)).eval()
    mb = _batch(seed=5)
    reason = C.split_model(model)
    assert isinstance(reason, str) and "gpt2" in reason
    before = C.fallbacks[reason]
    with caplog.at_level(logging.WARNING, logger=C.__name__):
        with torch.no_grad():
            want, _ = token_logprobs(model, mb, 0.7)
            got, _ = token_logprobs(model, mb, 0.7, chunk_tokens=4)
            token_logprobs(model, mb, 0.7, chunk_tokens=4)
    assert torch.equal(got, want)
    assert C.fallbacks[reason] == before + 2
    assert sum(reason in r.getMessage() for r in caplog.records) == (1 if before == 0 else 0)


def test_policy_worker_setting_reaches_update_old_logprobs_and_reference(tmp_path):
    """trainer.logits_chunk_tokens in PolicyWorker: recomputed old logprobs, the KL reference's pass and the
    update (loss, entropy, KL, grad norm, every gradient) as with the full logits. (Not the weights after the
    step: AdamW's first step is lr * g / (|g| + eps), which turns a 1e-12 difference in a gradient entry near
    eps into a visible one.)"""
    model = str(cached_tiny_model("tiny"))
    vocab = AutoConfig.from_pretrained(model).vocab_size
    rng = random.Random(7)
    rows = [Segment([rng.randrange(vocab) for _ in range(rng.randint(3, 15))],
                    [rng.randrange(vocab) for _ in range(n)], [-1.5] * n, advantage=rng.uniform(-1, 1),
                    trajectory_id=f"t{i}") for i, n in enumerate((4, 9, 2, 6))]
    got = []
    for chunk in (0, 8):
        torch.manual_seed(0)
        w = PolicyWorker(load_config(TrainConfig, [
            f"model.path={model}", f"out_dir={tmp_path / str(chunk)}", "algorithm.kl_coef=0.05",
            "algorithm.entropy_coef=0.01", "algorithm.temperature=0.7", "optim.lr=1e-3", "optim.warmup_steps=0",
            "trainer.token_budget=40", "trainer.progress=false", f"trainer.logits_chunk_tokens={chunk}"]))
        old = w.old_logprobs(rows)
        metrics = w.train_rows(weigh(rows, "token-mean"))
        grads = {n: p.grad.clone() for n, p in w.model.named_parameters()}  # train_rows leaves them after its step
        got.append((old, metrics, grads))
    (old0, m0, g0), (old1, m1, g1) = got
    for a, b in zip(old1, old0, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    for k in ("loss/total", "loss/entropy", "loss/kl", "train/grad_norm"):
        assert m1[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k
    for name, g in g0.items():
        torch.testing.assert_close(g1[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_router_aux_loss_is_the_same_through_the_chunked_forward():
    """trainer.router_aux_loss_coef with logits_chunk_tokens: the chunked path's own forward (logits_to_keep=1)
    asks the MoE model for its load-balancing loss too. The router never sees the logits, so the aux loss is
    the full path's exactly, and the logprobs agree to the float tolerance above."""
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                         num_experts_per_tok=2, max_position_embeddings=128, head_dim=8)
    model = Qwen3MoeForCausalLM(cfg).eval()
    mb = _batch()
    full_aux: list[torch.Tensor] = []
    chunk_aux: list[torch.Tensor] = []
    lp_full, _ = token_logprobs(model, mb, 1.0, router_aux=full_aux)
    lp_chunk, _ = token_logprobs(model, mb, 1.0, router_aux=chunk_aux, chunk_tokens=3)
    assert len(full_aux) == len(chunk_aux) == 1
    assert torch.equal(full_aux[0], chunk_aux[0])
    assert float(full_aux[0]) > 0
    assert torch.allclose(lp_full, lp_chunk, atol=1e-5, rtol=0)
