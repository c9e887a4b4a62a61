"""Packing and gradient accumulation: micro-batch losses and gradients sum to the un-split loss."""

from __future__ import annotations

import random

import pytest
import torch

from memrl.algorithms.losses import AGG_MODES, agg_loss, ppo_clip_loss
from memrl.training.update.packing import TrainBatch, collate, pack_rows, weigh
from memrl.training.update.policy import ppo_micro_loss, sft_micro_loss, token_logprobs
from memrl.types import Segment


def tiny_model(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def _seg(prompt: list[int], response: list[int], mask: list[int], old: list[float], adv: float, traj: str) -> Segment:
    return Segment(prompt, response, old, loss_mask=mask, advantage=adv, trajectory_id=traj)


def _mb(batch: TrainBatch, idx: list[int] | None = None, pad_id: int = 0):
    """The micro-batch of `batch`'s rows `idx` (all when None)."""
    idx = list(range(len(batch))) if idx is None else idx
    return collate([batch.segments[i] for i in idx], [batch.weights[i] for i in idx], pad_id)


def random_rows(n: int = 9, seed: int = 0) -> list[Segment]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p, r = rng.randint(2, 12), rng.randint(1, 8)
        mask = [1 if rng.random() < 0.8 else 0 for _ in range(r)]
        rows.append(_seg([rng.randrange(3, 64) for _ in range(p)], [rng.randrange(3, 64) for _ in range(r)], mask,
                         [-rng.random() * 3 for _ in range(r)], rng.uniform(-1, 1), f"t{i % 4}"))
    return rows


def test_pack_rows_keeps_every_row_within_budget():
    rows = random_rows(30)
    for budget in (1, 20, 50, 10_000):
        batches = pack_rows(rows, budget)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(30))  # never drops or repeats a row
        for b in batches:
            if len(b) > 1:
                assert len(b) * max(rows[i].num_tokens for i in b) <= budget


def test_collate_aligns_response_tokens():
    row = _seg([5, 6, 7], [8, 9], [1, 0], [-0.1, -0.2], 0.5, "t")
    mb = collate([row, _seg([5], [6], [1], [-0.3], 1.0, "u")], [0.25, 0.5], pad_id=0)
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 0, 0, 0]]
    assert mb.targets[0, 2:4].tolist() == [8, 9]  # position t predicts token t+1
    assert mb.loss_mask[0].tolist() == [0, 0, 1, 0]
    assert mb.old_logprobs[0, 2:4].tolist() == pytest.approx([-0.1, -0.2])
    assert mb.weights[0].tolist() == [0, 0, 0.25, 0]  # the row's weight on its trained tokens only
    assert mb.advantages[0].tolist() == [0, 0, 0.5, 0.5] and mb.advantages[1].tolist() == [1, 0, 0, 0]
    assert mb.loss_mask[1].tolist() == [1, 0, 0, 0] and mb.weights[1].tolist() == [0.5, 0, 0, 0]
    assert collate([row], None).weights.tolist() == [[0, 0, 0, 0]]  # no weights: nothing trains


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", AGG_MODES)
def test_accumulated_loss_and_grads_equal_unsplit(mode):
    segs = random_rows(9)
    rows = weigh(segs, mode)
    model = tiny_model()
    kw = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip_c": 3.0}

    # The un-split reference: one padded batch, losses aggregated by algorithms.losses.agg_loss.
    model.zero_grad()
    full = _mb(rows)
    lp, _ = token_logprobs(model, full, temperature=0.7)
    tok_loss, _ = ppo_clip_loss(lp, full.old_logprobs, full.advantages, full.loss_mask, **kw)
    ref_loss = agg_loss(tok_loss, full.loss_mask, mode, [r.trajectory_id for r in segs])
    # agg_loss computes weights from the padded [B, L-1] mask; rows share trajectory ids so traj-mean
    # sees the same structure as the per-row weights.
    ref_loss.backward()
    ref_grads = _grads(model)

    for budget in (10_000, 40, 1):
        model.zero_grad()
        total = 0.0
        batches = pack_rows(segs, budget)
        for idx in batches:
            part = ppo_micro_loss(model, _mb(rows, idx), 0.7, "ppo", kw)
            part.loss.backward()
            total += float(part.loss.detach())
        assert total == pytest.approx(float(ref_loss.detach()), rel=1e-5, abs=1e-7), (mode, budget, len(batches))
        for g, r in zip(_grads(model), ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_sft_loss_is_token_mean_nll():
    segs = random_rows(5)
    rows = weigh(segs, "token-mean")
    model = tiny_model()
    mb = _mb(rows)
    lp, _ = token_logprobs(model, mb)
    expected = -(lp * mb.loss_mask).sum() / mb.loss_mask.sum()
    split = sum(float(sft_micro_loss(model, _mb(rows, idx)).loss.detach()) for idx in pack_rows(segs, 30))
    assert split == pytest.approx(float(expected.detach()), rel=1e-5)


def test_logprobs_follow_the_temperature_convention():
    model = tiny_model()
    row = _seg([5, 6, 7], [8, 9], [1, 1], [0.0, 0.0], 0.0, "t")
    mb = collate([row])
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids).logits[0, :-1].float()
        lp, _ = token_logprobs(model, mb, temperature=0.5)
    expected = torch.log_softmax(logits / 0.5, -1).gather(-1, mb.targets[0].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(lp[0, 2:], expected[2:])  # the response's positions; prompt positions are 0
    assert torch.equal(lp[0, :2], torch.zeros(2))


def test_logprobs_skip_prompt_positions_but_match_full_logits():
    """Only positions from the first trained token on get logits; those (and their gradients) equal the
    full forward's, and earlier positions are 0."""
    model = tiny_model()
    rows = weigh([_seg([5, 6, 7, 8, 9, 10], [11, 12], [1, 1], [0.0, 0.0], 1.0, "a"),
                  _seg([5, 6, 7, 8], [13, 14, 15], [1, 0, 1], [0.0] * 3, -1.0, "b")], "token-mean")
    mb = _mb(rows)
    lp, ent = token_logprobs(model, mb, temperature=0.7, with_entropy=True)
    logp = torch.log_softmax(model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1] / 0.7, -1)
    full_lp = logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    full_ent = -(logp.exp() * logp).sum(-1)
    first = 3  # row b's prompt has 4 tokens: its first response token is predicted at position 3
    assert lp.shape == full_lp.shape == (2, 7)
    assert torch.equal(lp[:, :first], torch.zeros(2, first)) and torch.equal(ent[:, :first], torch.zeros(2, first))
    torch.testing.assert_close(lp[:, first:], full_lp[:, first:])
    torch.testing.assert_close(ent[:, first:], full_ent[:, first:])
    (g_new,) = torch.autograd.grad((lp * mb.weights).sum(), model.model.layers[0].mlp.up_proj.weight)
    (g_full,) = torch.autograd.grad((full_lp * mb.weights).sum(), model.model.layers[0].mlp.up_proj.weight)
    torch.testing.assert_close(g_new, g_full)
