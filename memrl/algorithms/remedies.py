"""Losses and terms against entropy and likelihood collapse (docs/guides/health.md).

- clip_cov (Clip-Cov, arXiv 2505.22617 section 4; verl core_algos.compute_policy_loss_clip_cov): PPO's clipped
  loss, with the gradient cut on a few tokens of high covariance between advantage and log-probability (the
  tokens that drive entropy down): among the trained tokens PPO did not clip whose covariance
  (A - mean A)(logp - mean logp) lies in (lb, ub), max(1, int(ratio * trained tokens)) picked at random get
  loss 0.
- kl_cov (KL-Cov, same paper; verl compute_policy_loss_kl_cov): the unclipped policy-gradient loss -A * rho,
  plus ppo_kl_coef * |logp - old| on the max(1, int(ratio * trained tokens)) tokens of largest covariance.
- llds_term: the LLDS-style term (after arXiv 2512.04220): on a row whose log-likelihood fell below the old
  policy's, max(0, old - logp) on each token whose log-probability fell; 0 elsewhere.

The covariances are taken over the micro-batch the loss sees, as verl takes them over its micro-batch; the
means over its trained tokens, the log-probabilities detached. rho = exp(logp - old), unclamped, as verl.
"""

from __future__ import annotations

import torch

from memrl.algorithms.base import register_loss
from memrl.algorithms.options import ClipCovOptions, KLCovOptions, LLDSOptions


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def token_covariance(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A - mean A) * (logp - mean logp) per token (no gradient), means over the trained tokens."""
    m = mask.to(logprobs.dtype)
    lp = logprobs.detach()
    return (advantages - _masked_mean(advantages, m)) * (lp - _masked_mean(lp, m))


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


@register_loss("clip_cov", ClipCovOptions)
def clip_cov_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = ClipCovOptions.clip_low,
    clip_high: float = ClipCovOptions.clip_high,
    clip_cov_ratio: float = ClipCovOptions.clip_cov_ratio,
    clip_cov_lb: float = ClipCovOptions.clip_cov_lb,
    clip_cov_ub: float = ClipCovOptions.clip_cov_ub,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (module docstring). The random pick uses torch's global generator (saved in checkpoints).
    Stats: clipfrac (PPO's clip share), cov_share (share of trained tokens cut by covariance), approx_kl."""
    advantages = _per_token(advantages, logprobs)
    m = mask.to(logprobs.dtype)
    trained = mask.bool()
    ratio = torch.exp(logprobs - old_logprobs)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = (loss2 > loss1) & trained
    cov = token_covariance(logprobs, advantages, mask)
    band = (cov > clip_cov_lb) & (cov < clip_cov_ub) & trained & ~clipped
    where = torch.nonzero(band)
    n = max(int(clip_cov_ratio * float(m.sum())), 1)
    if len(where) > n:
        where = where[torch.randperm(len(where))[:n]]
    keep = torch.ones_like(logprobs)
    keep[where[:, 0], where[:, 1]] = 0.0
    out = torch.maximum(loss1, loss2) * keep
    stats = {"clipfrac": float(_masked_mean(clipped.to(m.dtype), m)),
             "cov_share": float(_masked_mean((keep == 0).to(m.dtype), m)),
             "approx_kl": float(_masked_mean((old_logprobs - logprobs).detach(), m))}
    return torch.where(trained, out, torch.zeros_like(out)), stats


@register_loss("kl_cov", KLCovOptions)
def kl_cov_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_cov_ratio: float = KLCovOptions.kl_cov_ratio,
    ppo_kl_coef: float = KLCovOptions.ppo_kl_coef,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (module docstring): -A * rho, plus ppo_kl_coef * |logp - old| on the top-covariance tokens
    (torch.topk; ties as it breaks them). Stats: clipfrac 0, cov_share (share of trained tokens with the
    term), approx_kl."""
    advantages = _per_token(advantages, logprobs)
    m = mask.to(logprobs.dtype)
    trained = mask.bool()
    log_ratio = logprobs - old_logprobs
    out = -advantages * torch.exp(log_ratio)
    cov = token_covariance(logprobs, advantages, mask)
    flat = torch.nonzero(trained.reshape(-1), as_tuple=True)[0]
    picked = torch.zeros_like(logprobs)
    if len(flat):
        n = max(1, int(len(flat) * kl_cov_ratio))
        top = flat[torch.topk(cov.reshape(-1)[flat], n).indices]
        picked.view(-1)[top] = 1.0
    out = out + picked * ppo_kl_coef * log_ratio.abs()
    stats = {"clipfrac": 0.0, "cov_share": float(_masked_mean(picked, m)),
             "approx_kl": float(_masked_mean(-log_ratio.detach(), m))}
    return torch.where(trained, out, torch.zeros_like(out)), stats


def llds_term(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
              rows: str = LLDSOptions.rows) -> torch.Tensor:
    """The LLDS-style per-token term (module docstring), [B, L]: max(0, old - logp) on the tokens whose
    log-probability fell, in rows whose summed trained log-probability fell (rows="positive": and whose
    advantage is > 0); 0 elsewhere. Its gradient raises those tokens' log-probabilities back."""
    m = mask.to(logprobs.dtype)
    fell = ((logprobs - old_logprobs) * m).sum(-1).detach() < 0
    if rows == "positive":
        adv = advantages if advantages.dim() == 1 else (advantages * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        fell = fell & (adv > 0)
    return torch.relu(old_logprobs - logprobs) * m * fell.unsqueeze(-1).to(m.dtype)
