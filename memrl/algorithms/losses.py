"""Policy-loss pieces: PPO clip (clip-higher, dual clip), KL estimators, entropy, loss aggregation.

Aggregation is expressed as one WEIGHT per row computed once over the whole training batch
(`row_weights`; `loss_token_weights` spreads it over the row's trained tokens); the loss is
sum(weight * token_loss). Because every weight is fixed before
the batch is cut into micro-batches, summing the micro-batch losses gives exactly the full-batch loss
(and gradient), whatever the split. Formulas follow verl's `core_algos` (compute_policy_loss,
kl_penalty, agg_loss).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import torch

from memrl.algorithms.base import register_loss
from memrl.algorithms.options import OFF_POLICY_MODES, GSPOOptions, PPOOptions

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "traj-mean"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "traj-mean")
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else 0.0


@register_loss("ppo", PPOOptions)
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = PPOOptions.clip_low,
    clip_high: float = PPOOptions.clip_high,
    dual_clip_c: float | None = PPOOptions.dual_clip_c,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clip: max(-A*rho, -A*clip(rho, 1-clip_low, 1+clip_high)); for A<0 also min(that, -A*c) (dual clip).

    rho = exp(logprobs - old_logprobs) (log-ratio clamped to [-20, 20]). `advantages` is [B, L] or
    [B] (one per row). Returns the per-token loss [B, L] (0 where mask is 0) and stats: clipfrac,
    clipfrac_lower (dual clip active), approx_kl = mean(old - new), all masked means over this batch.
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1.0 (or None to disable), got {dual_clip_c}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    m = mask.to(logprobs.dtype)
    log_ratio = torch.clamp(logprobs - old_logprobs, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(loss1, loss2)
    stats = {"clipfrac": _masked_mean((loss2 > loss1).to(m.dtype), m)}
    if dual_clip_c is not None:
        loss3 = -advantages * dual_clip_c
        dual = torch.minimum(clipped, loss3)
        stats["clipfrac_lower"] = _masked_mean(((clipped > loss3) & (advantages < 0)).to(m.dtype), m)
        clipped = torch.where(advantages < 0, dual, clipped)
    else:
        stats["clipfrac_lower"] = 0.0
    stats["approx_kl"] = _masked_mean(-log_ratio.detach(), m)
    return torch.where(mask.bool(), clipped, torch.zeros_like(clipped)), stats


@register_loss("gspo", GSPOOptions)
def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    seq_clip_low: float = GSPOOptions.seq_clip_low,
    seq_clip_high: float = GSPOOptions.seq_clip_high,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (arXiv 2507.18071; verl's compute_policy_loss_gspo): a sequence-level ratio per row,
    s = exp(mean over the row's trained tokens of (logprobs - old_logprobs)), clipped to [1 - seq_clip_low,
    1 + seq_clip_high]: per token max(-A * s_t, -A * clip(s_t)) with s_t = sg[s] * exp(logprobs - sg[logprobs])
    (value s on every token; d s_t / d logprob_t = s_t), the log clamped at 10 as verl does.

    Under seq-mean-token-mean aggregation (AlgorithmSection.check requires it) the gradient is GSPO's,
    -A * s * mean_t grad log pi_t per row while unclipped. A row is whole within a micro-batch (packing never
    splits one). Stats: clipfrac (share of trained tokens clipped), clipfrac_lower = 0, approx_kl."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    m = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    seq = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    log_s = torch.clamp(logprobs - logprobs.detach() + seq.detach().unsqueeze(-1), max=10.0)
    s = torch.exp(log_s)
    loss1 = -advantages * s
    loss2 = -advantages * torch.clamp(s, 1.0 - seq_clip_low, 1.0 + seq_clip_high)
    out = torch.maximum(loss1, loss2)
    stats = {"clipfrac": _masked_mean((loss2 > loss1).to(m.dtype), m), "clipfrac_lower": 0.0,
             "approx_kl": _masked_mean(-log_ratio.detach(), m)}
    return torch.where(mask.bool(), out, torch.zeros_like(out)), stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL(pi || ref) estimate. k1: d; k2: d^2/2; k3 = low_var_kl: e^-d + d - 1 clamped to [-10, 10].

    d = logprobs - ref_logprobs; for k3 the log-ratio is clamped to [-20, 20] first (as in verl).
    """
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind in ("k3", "low_var_kl"):
        kl = torch.clamp(-d, -20.0, 20.0)
        return torch.clamp(torch.exp(kl) - kl - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; known: {', '.join(KL_KINDS)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: logsumexp(z) - sum(softmax(z) * z)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def row_weights(
    masks: Sequence[Sequence[int]], traj_ids: Sequence[str] | None = None, mode: str = "token-mean"
) -> list[float]:
    """One loss weight per row such that sum over rows of weight * (sum of the row's trained token losses)
    is the `mode` aggregate of the whole batch (every trained token of a row weighs the same).

    token-mean: 1 / N (N = trained tokens in the batch). seq-mean-token-mean: 1 / (R * n_r).
    seq-mean-token-sum: 1 / R. traj-mean: 1 / (J * n_j) (each trajectory's token mean, then the mean
    over trajectories). n_r / n_j = trained tokens of the row / trajectory; R and J count only rows and
    trajectories with at least one trained token. A row without trained tokens weighs 0. The training
    driver computes these once over a whole mini-batch, before it is split between ranks and micro-batches.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; known: {', '.join(AGG_MODES)}")
    row_tokens = [sum(1 for v in m if v) for m in masks]
    if mode == "token-mean":
        total = sum(row_tokens)
        return [1.0 / total if n else 0.0 for n in row_tokens]
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        rows = sum(1 for n in row_tokens if n)
        if mode == "seq-mean-token-mean":
            return [1.0 / (rows * n) if n else 0.0 for n in row_tokens]
        return [1.0 / rows if n else 0.0 for n in row_tokens]
    if traj_ids is None or len(traj_ids) != len(masks):
        got = "none" if traj_ids is None else len(traj_ids)
        raise ValueError(f"traj-mean aggregation needs one trajectory id per row: {len(masks)} rows, {got} ids")
    traj_tokens: dict[str, int] = defaultdict(int)
    for t, n in zip(traj_ids, row_tokens, strict=True):
        traj_tokens[t] += n
    trajs = sum(1 for n in traj_tokens.values() if n)
    return [1.0 / (trajs * traj_tokens[t]) if n else 0.0 for t, n in zip(traj_ids, row_tokens, strict=True)]


def loss_token_weights(
    masks: Sequence[Sequence[int]], traj_ids: Sequence[str] | None = None, mode: str = "token-mean"
) -> list[list[float]]:
    """Per-token weights w such that sum(w * token_loss) is the `mode` aggregate of the whole batch: each
    trained token carries its row's `row_weights`, masked-out tokens weigh 0. Rows may be ragged."""
    return [[w if v else 0.0 for v in m] for w, m in zip(row_weights(masks, traj_ids, mode), masks, strict=True)]


def agg_loss(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    traj_ids: Sequence[str] | None = None,
) -> torch.Tensor:
    """Scalar sum(weight * token_loss) over a [B, L] batch, weights from `loss_token_weights(mask, traj_ids, mode)`.

    For micro-batching, compute the weights once over the full batch and sum(weights * loss) per micro-batch.
    """
    weights = loss_token_weights(mask.int().tolist(), traj_ids, mode)
    w = torch.tensor(weights, dtype=token_loss.dtype, device=token_loss.device)
    return (torch.where(w != 0, token_loss, torch.zeros_like(token_loss)) * w).sum()


def off_policy_weights(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mode: str, cap: float | None
) -> torch.Tensor:
    """Per-token correction weight (no gradient) multiplying the PPO token loss; docs/guides/async.md.

    w = exp(old - behaviour), the log-ratio clamped to [-20, 20]; `old` is the trainer's logprob before
    the update, `behaviour` the engine's sampling logprob. tis (verl, slime): min(w, cap), truncated.
    decoupled (AReaL's behaviour weight): w where w <= cap and 0 above it (the token is dropped, not
    truncated); cap None = no cap. none: all ones.
    """
    if mode not in OFF_POLICY_MODES:
        raise ValueError(f"unknown off-policy correction {mode!r}; known: {', '.join(OFF_POLICY_MODES)}")
    with torch.no_grad():
        if mode == "none":
            return torch.ones_like(old_logprobs)
        w = torch.exp(torch.clamp(old_logprobs.detach() - behaviour_logprobs, -20.0, 20.0))
        if mode == "tis":
            if cap is None:
                raise ValueError("off_policy=tis needs a cap (algorithm.tis_cap)")
            return torch.clamp(w, max=cap)
        return w if cap is None else torch.where(w <= cap, w, torch.zeros_like(w))


MISMATCH_SUMS: tuple[str, ...] = ("abs_diff", "k3", "outside", "tokens")
MISMATCH_PAIRS: tuple[str, ...] = ("old_vs_engine", "current_vs_old")
"""With recomputed old logprobs (algorithm.old_logprobs=trainer), the mismatch of these pairs is logged too:
the pre-update trainer policy vs the engine, and the training forward vs the pre-update policy."""


def mismatch_sums(
    trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor, clip: float
) -> dict[str, float]:
    """Sums over the masked tokens of the train/inference mismatch (no gradient); divide by `tokens`.

    d = trainer - engine (log-ratio, clamped to [-20, 20] for k3). abs_diff: sum |d|. k3: sum(exp(d) - 1 - d),
    the k3 estimate of KL(engine || trainer) from tokens the engine sampled (unbiased, >= 0 per token).
    outside: tokens whose ratio exp(d) is outside [1/clip, clip], i.e. |d| > log(clip). tokens: the count.
    """
    with torch.no_grad():
        m = mask.detach().to(torch.float64)
        d = trainer_logprobs.detach().to(torch.float64) - engine_logprobs.detach().to(torch.float64)
        dc = torch.clamp(d, -20.0, 20.0)
        return {
            "abs_diff": float((d.abs() * m).sum()),
            "k3": float(((torch.exp(dc) - 1.0 - dc) * m).sum()),
            "outside": float(((d.abs() > math.log(clip)).to(m.dtype) * m).sum()),
            "tokens": float(m.sum()),
        }


def mismatch_means(sums: dict[str, float]) -> dict[str, float]:
    """The mismatch metrics from `mismatch_sums` totals (summed over micro-batches and ranks): token means.
    No trained token: {} (nothing to report)."""
    n = sums.get("tokens", 0.0)
    if n <= 0:
        return {}
    return {"abs_logprob_diff_mean": sums["abs_diff"] / n, "kl_k3": sums["k3"] / n,
            "ratio_outside_share": sums["outside"] / n, "tokens": n}
