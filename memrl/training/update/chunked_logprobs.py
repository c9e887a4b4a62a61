"""Per-token log-probabilities and entropy of a causal LM without its full logits (trainer.logits_chunk_tokens).

The model's own forward runs with `logits_to_keep=1` and a hook takes its decoder's last hidden states
(`final_hidden`, by `capture_final_hidden`, which prefix sharing's forwards use too); the vocabulary
projection, temperature, log_softmax, gather and entropy then run on `chunk` tokens at a time, and the
backward pass recomputes each chunk's logits (`ChunkedHeadLogprobs`), so no [tokens x vocab] tensor larger
than one chunk's ever exists (a 151,936-entry vocabulary makes the fp32 logits of one 32K-token row ~19.5
GB). Same formulas as memrl.training.update.policy.token_logprobs, with z = lm_head(h) / T, y the next token:

    logprob = log_softmax(z)[y]        entropy H = -sum_v p_v log p_v,   p = softmax(z)
    d logprob / dz = onehot(y) - p     dH / dz_v = -p_v (log p_v + H)

Models whose logits are not plain `lm_head(decoder(...).last_hidden_state)` as this module can see it
(`split_model` names the reason) keep the full-logits path.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from memrl.training.update.lora import BaseReference

log = logging.getLogger(__name__)

PLAIN_HEAD_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "llama", "mistral"})
"""config.model_type of the transformers CausalLMs whose logits are exactly lm_head(final hidden state):
no soft-capping or logit scaling after the projection (Gemma 2, Cohere, Granite have some)."""

fallbacks: Counter[str] = Counter()
"""How many token_logprobs calls with chunking asked for fell back to the full logits, by reason."""


@dataclass
class HeadSplit:
    """A causal LM's decoder (whose output's `.last_hidden_state` has the final norm applied) and lm_head."""

    decoder: torch.nn.Module
    head: torch.nn.Linear


def split_model(model: Any) -> HeadSplit | str:
    """The decoder and lm_head inside `model` (plain, PEFT-wrapped, FSDP2-sharded, or a LoRA policy's
    BaseReference, which holds the policy as `.model`), or the reason the chunked path cannot apply."""
    inner = model.model if isinstance(model, BaseReference) else model
    base = inner.get_base_model() if hasattr(inner, "peft_config") and hasattr(inner, "get_base_model") else inner
    kind = getattr(getattr(base, "config", None), "model_type", None)
    if kind not in PLAIN_HEAD_TYPES:
        return f"model_type {kind!r} is not known to compute its logits as lm_head(hidden) alone"
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if decoder is None or head is None:
        return f"{type(base).__name__} exposes no decoder / output embeddings"
    if type(head) is not torch.nn.Linear:
        return f"lm_head is a {type(head).__name__}, not a plain Linear (an adapter on it?)"
    return HeadSplit(decoder, head)


def fell_back(model: Any, reason: str) -> None:
    """Count a fallback to the full logits; log its reason once per reason."""
    if not fallbacks[reason]:
        log.warning("trainer.logits_chunk_tokens: full logits for %s: %s", type(model).__name__, reason)
    fallbacks[reason] += 1


@contextmanager
def capture_final_hidden(model: Any, split: HeadSplit, who: str) -> Iterator[list[torch.Tensor]]:
    """A block around one forward of `model`: a forward hook on its decoder keeps the decoder's last hidden
    state in the list it yields (only this thread's: an engine sharing the module may run in another).
    Leaving the block checks that the decoder ran exactly once; `who` names the caller in the error."""
    grabbed: list[torch.Tensor] = []
    me = threading.get_ident()

    def grab(_module: Any, _args: Any, out: Any) -> None:
        if threading.get_ident() == me:
            grabbed.append(out.last_hidden_state)

    handle = split.decoder.register_forward_hook(grab)
    try:
        yield grabbed
    finally:
        handle.remove()
    if len(grabbed) != 1:
        raise RuntimeError(f"{who}: the decoder of {type(model).__name__} ran {len(grabbed)} times in one forward "
                           "(expected once)")


def final_hidden(model: Any, split: HeadSplit, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 router_aux: list[torch.Tensor] | None = None, position_ids: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """The decoder's last hidden state [B, L, H], taken by a forward hook (`capture_final_hidden`) during the
    model's own forward with `logits_to_keep=1` (one position's logits). Going through that forward keeps what
    wraps the decoder: PEFT's adapters, a BaseReference's adapters-off eval context, and FSDP2's root, which
    gathers the embedding and lm_head (and leaves them gathered for the backward pass) only in its own forward.
    `router_aux` (a list): the forward also computes an MoE model's load-balancing loss, appended.
    `position_ids`: a sequence-parallel shard's global positions (memrl.training.update.ulysses)."""
    extra: dict[str, Any] = {"output_router_logits": True} if router_aux is not None else {}
    if position_ids is not None:
        extra["position_ids"] = position_ids
    with capture_final_hidden(model, split, "chunked logprobs") as grabbed:
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1, use_cache=False, **extra)
    if router_aux is not None:
        router_aux.append(out.aux_loss)
    return grabbed[0]


def hidden_logprobs(model: Any, split: HeadSplit, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    targets: torch.Tensor, first: int, temperature: float, with_entropy: bool, chunk: int,
                    router_aux: list[torch.Tensor] | None = None, position_ids: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logprob and entropy [B, W-first] of positions first..W-1, W = targets' width (each predicting
    targets[:, first:]): L-1 for whole rows, L for a sequence-parallel shard, whose last position predicts
    the next shard's first token. `router_aux`, `position_ids` as final_hidden."""
    h = final_hidden(model, split, input_ids, attention_mask, router_aux, position_ids)[:, first:targets.shape[1]]
    b, k, width = h.shape
    lp, ent = ChunkedHeadLogprobs.apply(h.reshape(b * k, width), split.head.weight, split.head.bias,
                                        targets[:, first:].reshape(-1), temperature, chunk, with_entropy)
    return lp.view(b, k), ent.view(b, k) if with_entropy else None


def _chunk_logp(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """log_softmax(lm_head(h).float() / T) of one chunk of tokens, as the full path computes it."""
    z = torch.nn.functional.linear(h, weight, bias).float()
    if temperature != 1.0:
        z = z / temperature
    return torch.log_softmax(z, dim=-1)


class ChunkedHeadLogprobs(torch.autograd.Function):
    """(hidden [N, H], lm_head weight [V, H], bias [V] | None, targets [N]) -> (logprob [N], entropy [N]),
    fp32, `chunk` tokens at a time; backward recomputes each chunk's logits. The weight's gradient sums
    over chunks in fp32 (one matmul over all tokens accumulates in fp32 too)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, chunk: int, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            logp = _chunk_logp(hidden[s:s + chunk], weight, bias, temperature)
            lp[s:s + chunk] = logp.gather(-1, targets[s:s + chunk, None]).squeeze(-1)
            if with_entropy:
                ent[s:s + chunk] = -(logp.exp().mul_(logp)).sum(-1)
            del logp  # before the next chunk's logits exist: one chunk's worth live, not two
        ctx.save_for_backward(hidden, weight, bias, targets, ent)
        ctx.temperature, ctx.chunk = temperature, chunk
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx: Any, g_lp: torch.Tensor, g_ent: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, bias, targets, ent = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        with_entropy = ent.numel() > 0
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]
            logp = _chunk_logp(h, weight, bias, t)
            p = logp.exp()
            gl = g_lp[s:s + chunk, None]
            if with_entropy:  # dz = g_lp (onehot - p) - g_ent p (log p + H), the onehot added below
                gz = logp.add_(ent[s:s + chunk, None]).mul_(g_ent[s:s + chunk, None]).add_(gl).mul_(p).neg_()
            else:
                gz = p.mul_(gl).neg_()
            gz.scatter_add_(1, targets[s:s + chunk, None], gl)
            if t != 1.0:
                gz = gz.div_(t)
            g_logits = gz.to(hidden.dtype)
            if need_h:
                grad_h[s:s + chunk] = g_logits @ weight
            if need_w:
                grad_w += (g_logits.t() @ h).float()
            if need_b:
                grad_b += g_logits.float().sum(0)
            del logp, p, gz, g_logits  # before the next chunk's logits exist
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)

