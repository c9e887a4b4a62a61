"""The policy side of training: token logprobs under the engine's temperature convention, and the
weighted PPO / SFT losses of one micro-batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from memrl.training.packing import MicroBatch


def token_logprobs(
    model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits / T) of each next token, [B, L-1] (the engine's convention; T=1 for greedy).

    With `with_entropy`, also the entropy of softmax(logits / T) per position.
    """
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    ent = None
    if with_entropy:
        ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


@dataclass
class LossParts:
    """One micro-batch's contribution: the loss to backpropagate and weighted sums for logging."""

    loss: torch.Tensor
    sums: dict[str, float] = field(default_factory=dict)


def ppo_micro_loss(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float,
    loss_name: str = "ppo",
    loss_kwargs: dict | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "low_var_kl",
    entropy_coef: float = 0.0,
) -> LossParts:
    """sum(w * (policy_loss + kl_coef * kl - entropy_coef * entropy)) over this micro-batch.

    `mb.weights` were fixed over the whole batch, so summing this over micro-batches equals the
    un-split loss (and its gradient). Logged sums are weighted the same way (so they add up to means).
    """
    from memrl.algorithms.losses import kl_penalty
    from memrl.algorithms.registry import get_loss

    lp, ent = token_logprobs(model, mb, temperature, with_entropy=True)
    per_tok, stats = get_loss(loss_name)(lp, mb.old_logprobs, mb.advantages, mb.loss_mask, **(loss_kwargs or {}))
    w = mb.weights
    loss = (w * per_tok).sum()
    sums = {"pg_loss": float(loss.detach())}
    if ref_logprobs is not None:
        kl = kl_penalty(lp, ref_logprobs, kl_kind) * mb.loss_mask
        kl_term = (w * kl).sum()
        sums["kl"] = float(kl_term.detach())
        if kl_coef:
            loss = loss + kl_coef * kl_term
    assert ent is not None
    ent_term = (w * ent).sum()
    sums["entropy"] = float(ent_term.detach())
    if entropy_coef:
        loss = loss - entropy_coef * ent_term
    wsum = float(w.sum())
    for k in ("clipfrac", "approx_kl"):
        if k in stats:
            sums[k] = stats[k] * wsum
    return LossParts(loss, sums)


def sft_micro_loss(model: torch.nn.Module, mb: MicroBatch) -> LossParts:
    """Weighted negative log-likelihood of the masked response tokens (weights fixed over the batch)."""
    lp, _ = token_logprobs(model, mb, 1.0)
    loss = -(mb.weights * lp * mb.loss_mask).sum()
    return LossParts(loss, {"nll": float(loss.detach())})
