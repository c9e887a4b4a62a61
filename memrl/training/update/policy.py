"""The policy side of training: token logprobs under the engine's temperature convention, the teacher-forced
logprobs of rollout.sync_check's probe, and the weighted PPO / SFT losses of one micro-batch."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from memrl.algorithms.losses import kl_penalty, mismatch_sums, off_policy_weights
from memrl.algorithms.registry import get_loss
from memrl.algorithms.remedies import llds_term
from memrl.training.update import chunked_logprobs as C
from memrl.training.update import prefix_sharing as P
from memrl.training.update.packing import MicroBatch


def token_logprobs(
    model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0, with_entropy: bool = False,
    router_aux: list[torch.Tensor] | None = None, chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(logits / T) of each next token, [B, L-1] (the engine's convention; T=1 for greedy).

    With `with_entropy`, also the entropy of softmax(logits / T) per position. Only positions from the
    micro-batch's first trained token on get logits (`logits_to_keep`): the vocabulary projection and
    softmax over prompt positions nobody trains on were half of an update's time on the CPU demo.
    Earlier positions are 0 (their loss mask and weights are 0). `router_aux` (a list): the forward also
    computes an MoE model's load-balancing loss (output_router_logits, transformers' aux_loss), appended.
    `chunk_tokens` > 0 (trainer.logits_chunk_tokens): the same numbers without the full logits, that many
    tokens' logits at a time (memrl.training.update.chunked_logprobs), where the model allows it. `mb.share` set
    (trainer.prefix_sharing): each shared prefix forwarded once (memrl.training.update.prefix_sharing), the same
    numbers to float rounding, where the model and the pass allow it.
    """
    width = mb.targets.shape[1]  # L-1; a sequence-parallel shard (mb.position_ids set): its width L
    first = _first_trained_position(mb)
    if mb.share is not None:
        split_or_why = P.why_not(model, router_aux, mb.position_ids)
        if isinstance(split_or_why, C.HeadSplit):
            return P.shared_logprobs(model, split_or_why, mb.share, mb.input_ids, mb.targets, first, temperature,
                                     with_entropy, chunk_tokens)
        P.fell_back(split_or_why)
    if chunk_tokens > 0:
        split = C.split_model(model)
        if isinstance(split, C.HeadSplit):
            lp, ent = C.hidden_logprobs(model, split, mb.input_ids, mb.attention_mask, mb.targets, first, temperature,
                                        with_entropy, chunk_tokens, router_aux, mb.position_ids)
            return _pad_front(lp, first), None if ent is None else _pad_front(ent, first)
        C.fell_back(model, split)
    kwargs: dict = {"logits_to_keep": mb.input_ids.shape[1] - first} if first > 0 and _takes_logits_to_keep(model) else {}
    if router_aux is not None:
        kwargs["output_router_logits"] = True
    if mb.position_ids is not None:
        kwargs["position_ids"] = mb.position_ids
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, **kwargs)
    if router_aux is not None:
        router_aux.append(out.aux_loss)
    logits = out.logits[:, : out.logits.shape[1] - (mb.input_ids.shape[1] - width), :].float()
    start = width - logits.shape[1]
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, mb.targets[:, start:].unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return _pad_front(lp, start), None if ent is None else _pad_front(ent, start)


def teacher_forced_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[float]:
    """log_softmax (T=1) of each of `tokens` after `prompt` and the tokens before it, under `model` (in eval
    mode, no gradient): the trainer's side of rollout.sync_check's probe (memrl.training.sync.sync_check)."""
    if not tokens:
        return []
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + tokens], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    finally:
        model.train(was_training)
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logp.gather(-1, ids[0, len(prompt):].unsqueeze(-1)).squeeze(-1).tolist()


def _pad_front(x: torch.Tensor, n: int) -> torch.Tensor:
    """`x` [B, K] with n zero columns in front (the untrained prompt positions)."""
    return torch.nn.functional.pad(x, (n, 0)) if n else x


def _first_trained_position(mb: MicroBatch) -> int:
    """The first column where any row has a nonzero loss mask or weight (the width when there is none)."""
    used = ((mb.loss_mask != 0) | (mb.weights != 0)).any(0).nonzero()
    return int(used[0]) if len(used) else mb.loss_mask.shape[1] - 1


_KEEPS: dict[type, bool] = {}


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes `logits_to_keep` (every transformers CausalLM since 4.50)."""
    cls = type(model.get_base_model() if hasattr(model, "get_base_model") else model)  # PEFT passes it on
    if cls not in _KEEPS:
        _KEEPS[cls] = "logits_to_keep" in inspect.signature(cls.forward).parameters
    return _KEEPS[cls]


def clip_norm(grad_clip: float) -> float:
    """The max_norm handed to clip_grad_norm_: grad_clip > 0 clips, 0 means no clipping (infinity: the
    norm is still measured and logged). A negative value would reverse every update (torch scales the
    gradient by max_norm / norm): refused here too, for configs built in code."""
    if grad_clip < 0:
        raise ValueError(f"grad_clip must be >= 0 (0 = no clipping), got {grad_clip}")
    return grad_clip if grad_clip > 0 else float("inf")


@dataclass
class LossParts:
    """One micro-batch's contribution: the loss to backpropagate and weighted sums for logging."""

    loss: torch.Tensor
    sums: dict[str, float] = field(default_factory=dict)
    mismatch: dict[str, float] = field(default_factory=dict)
    """Unweighted token sums of the train/inference mismatch (memrl.algorithms.losses.mismatch_sums)."""
    pairs: dict[str, dict[str, float]] = field(default_factory=dict)
    """With recomputed old logprobs: the same sums for "old_vs_engine" (the trainer's pre-update policy
    against the engine's sampling) and "current_vs_old" (this forward against the pre-update policy)."""


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
    off_policy: str = "none",
    off_policy_cap: float | None = None,
    mismatch_clip: float = 2.0,
    router_aux_coef: float = 0.0,
    chunk_tokens: int = 0,
    llds: tuple[float, str] = (0.0, "all"),
) -> LossParts:
    """sum(w * (policy_loss + kl_coef * kl - entropy_coef * entropy + llds_coef * llds)) over this micro-batch, plus
    router_aux_coef * sum(w) * aux for an MoE model (aux: the micro-batch's load-balancing loss, Switch
    Transformer's, arXiv 2101.03961 eq. 4, as transformers computes it), so the aux term over a mini-batch
    is the weight-averaged aux of its micro-batches.

    `mb.weights` were fixed over the whole batch, so summing this over micro-batches equals the
    un-split loss (and its gradient). Logged sums are weighted the same way (so they add up to means).
    The old logprobs of the PPO ratio: `mb.prox_logprobs` when the trainer recomputed them before the RL
    step's first optimizer step (algorithm.old_logprobs=trainer, as verl and slime), else the engine's
    sampling logprobs `mb.old_logprobs` (off_policy none) or this forward's own, detached (tis / decoupled:
    the pre-update policy only in the first optimizer step). `off_policy` (docs/guides/async.md): tis / decoupled
    multiply each token's loss by memrl.algorithms.losses.off_policy_weights(old, engine, off_policy,
    off_policy_cap): behaviour = the engine, proximal = old. The mismatch sums compare this forward's
    logprobs with the engine's on the trained tokens (`mismatch_clip`: c of the ratio's [1/c, c] band);
    with recomputed old logprobs `pairs` adds old vs engine and this forward vs old. `chunk_tokens`: as
    token_logprobs. `llds`: (coef, rows) of the LLDS-style term (memrl.algorithms.remedies.llds_term) against
    the same old logprobs as the ratio.
    """
    aux: list[torch.Tensor] | None = [] if router_aux_coef > 0 else None
    lp, ent = token_logprobs(model, mb, temperature, with_entropy=True, router_aux=aux, chunk_tokens=chunk_tokens)
    engine_lp, prox = mb.old_logprobs, mb.prox_logprobs
    fn = get_loss(loss_name)
    is_w = None
    if off_policy == "none":
        old = prox if prox is not None else engine_lp
        per_tok, stats = fn(lp, old, mb.advantages, mb.loss_mask, **(loss_kwargs or {}))
    else:
        old = prox if prox is not None else lp.detach()
        per_tok, stats = fn(lp, old, mb.advantages, mb.loss_mask, **(loss_kwargs or {}))
        is_w = off_policy_weights(old, engine_lp, off_policy, off_policy_cap)
        per_tok = per_tok * is_w
    w = mb.weights
    loss = (w * per_tok).sum()
    sums = {"pg_loss": float(loss.detach())}
    if llds[0]:
        llds_sum = (w * llds_term(lp, old, mb.loss_mask, mb.advantages, llds[1])).sum()
        sums["llds"] = float(llds_sum.detach())
        loss = loss + llds[0] * llds_sum
    if is_w is not None:
        sums["is_weight"] = float((w * is_w).sum())
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
    if aux:
        aux_term = aux[0].to(loss.dtype) * wsum
        sums["router_aux"] = float(aux_term.detach())
        loss = loss + router_aux_coef * aux_term
    for k in ("clipfrac", "approx_kl", "cov_share"):
        if k in stats:
            sums[k] = stats[k] * wsum
    pairs = {} if prox is None else {
        "old_vs_engine": mismatch_sums(prox, engine_lp, mb.loss_mask, mismatch_clip),
        "current_vs_old": mismatch_sums(lp, prox, mb.loss_mask, mismatch_clip)}
    return LossParts(loss, sums, mismatch_sums(lp, engine_lp, mb.loss_mask, mismatch_clip), pairs)


def sft_micro_loss(model: torch.nn.Module, mb: MicroBatch, chunk_tokens: int = 0) -> LossParts:
    """Weighted negative log-likelihood of the masked response tokens (weights fixed over the batch);
    `chunk_tokens`: as token_logprobs."""
    lp, _ = token_logprobs(model, mb, 1.0, chunk_tokens=chunk_tokens)
    loss = -(mb.weights * lp * mb.loss_mask).sum()
    return LossParts(loss, {"nll": float(loss.detach())})
