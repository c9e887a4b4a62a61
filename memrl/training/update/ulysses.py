"""Sequence parallelism (Ulysses, arXiv 2309.14509): groups of S ranks share each micro-batch, each rank
holding L/S consecutive tokens of every row; attention swaps the split from tokens to heads and back.

Before attention each rank holds its L/S tokens of all H heads (RoPE already applied at the tokens' global
positions: `shard` hands each rank its position_ids); an all-to-all gives it all L tokens of H/S heads,
it runs causal attention over the whole sequence, and a second all-to-all returns its tokens of all heads.
Everything else in the model (projections, MLP, norms, the vocabulary projection, the loss) is per token
and runs on the shard. A rank's log-prob at its last position predicts the first token of the next shard:
`shard` cuts the [B, L-1] per-token tensors (targets, masks, weights) at the same columns as the ids, so
that boundary is in place. The group's losses sum to the unsharded loss, and the gradients of every rank
(each its share of the backward through the all-to-alls) sum to its gradient: with FSDP averaging over
the world, memrl's loss scale by the world size (memrl.training.ranks.distributed) stays exact.

KV heads: when S does not divide num_key_value_heads but num_key_value_heads divides S, each KV head is
repeated S / num_key_value_heads times before the all-to-all (as verl's ulysses does), so each rank gets
the one KV head its query heads use.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from transformers import AttentionInterface

from memrl.training.update.packing import MicroBatch

ATTN_NAME = "memrl_ulysses"
"""The attention implementation a model's config names while `sharded` is active."""
SUPPORTED_MODELS = ("qwen2", "qwen3")


def check_model(config: Any, size: int) -> None:
    """One-line errors for a model that sequence parallelism over `size` ranks cannot split."""
    kind = getattr(config, "model_type", "?")
    if kind not in SUPPORTED_MODELS:
        raise ValueError(f"trainer.sequence_parallel={size}: model type {kind!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODELS)})")
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % size:
        raise ValueError(f"trainer.sequence_parallel={size} must divide the model's num_attention_heads={heads}")
    if kv % size and size % kv:
        raise ValueError(f"trainer.sequence_parallel={size} and num_key_value_heads={kv}: one must divide the other "
                         "(KV heads are split over the group, or each repeated S / num_key_value_heads times)")
    if getattr(config, "use_sliding_window", False) or "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        raise ValueError(f"trainer.sequence_parallel={size}: sliding-window attention is not supported")


def shard(mb: MicroBatch, size: int, index: int) -> MicroBatch:
    """Rank `index`'s shard of `mb` among `size`: the ids padded on the right to a multiple of `size`
    (attention mask 0), its c = L/size columns with position_ids at their global positions, and the same
    columns of every per-token [B, L-1] tensor, padded likewise (loss mask and weights 0): column t of
    `targets` is the token after position t, so the last column of a shard holds the next shard's first
    token. Per-token tensors of the shard are [B, c], as wide as its ids."""
    b, width = mb.input_ids.shape
    c = -(-width // size)
    cols = slice(index * c, (index + 1) * c)

    def cut(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, size * c - t.shape[1]))[:, cols]

    pos = torch.arange(index * c, (index + 1) * c, device=mb.input_ids.device).unsqueeze(0).expand(b, -1)
    return MicroBatch(cut(mb.input_ids), cut(mb.attention_mask), cut(mb.targets), cut(mb.loss_mask),
                      cut(mb.old_logprobs), cut(mb.advantages), cut(mb.weights), mb.num_rows, mb.num_tokens,
                      None if mb.prox_logprobs is None else cut(mb.prox_logprobs), position_ids=pos)


def unshard(parts: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """The [B, c] per-token shards of a group, in rank order, as the [B, width] tensor they cut."""
    return torch.cat(list(parts), dim=1)[:, :width]


def gather(t: torch.Tensor, group: Any, width: int) -> torch.Tensor:
    """Every rank's [B, c] shard of a per-token tensor (no gradient), joined as [B, width]."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return unshard(parts, width)


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    """Chunk j of `x` along scatter_dim goes to rank j; the chunks received, in rank order, are joined
    along gather_dim."""
    size = dist.get_world_size(group)
    send = torch.stack([c.contiguous() for c in x.chunk(size, dim=scatter_dim)])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """`_all_to_all` with its gradient: the reverse all-to-all (gather_dim scattered, scatter_dim gathered)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


_GROUP: list[Any] = []
"""The process group of the active `sharded` context (empty: none)."""


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Ulysses attention: q [B, H, c, D], k / v [B, Hkv, c, D] (this rank's tokens, all heads) -> all L
    tokens of H/S heads -> causal attention over the whole sequence -> [B, c, H, D]. The model's mask is
    not used (it covers the shard only): rows are right-padded (memrl.training.update.packing.collate), so the
    causal mask alone keeps every real token from padding."""
    group = _GROUP[-1]
    size = dist.get_world_size(group)
    if key.shape[1] % size:  # fewer KV heads than ranks (check_model: they divide S): repeat each
        key = key.repeat_interleave(size // key.shape[1], dim=1)
        value = value.repeat_interleave(size // value.shape[1], dim=1)
    q, k, v = (_AllToAll.apply(t, 1, 2, group) for t in (query, key, value))
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling)
    # [B, H/S, L, D] -> [B, L, H/S, D] -> this rank's c tokens of all H heads
    return _AllToAll.apply(out.transpose(1, 2), 1, 2, group), None


AttentionInterface.register(ATTN_NAME, _attention)


@contextmanager
def sharded(models: Sequence[torch.nn.Module], group: Any) -> Iterator[None]:
    """Within the block, the forwards (and backwards, gradient checkpointing's recompute included) of
    `models` run Ulysses attention over `group`; their attention implementation is restored after."""
    configs = [m.config for m in models]
    before = [c._attn_implementation for c in configs]
    _GROUP.append(group)
    try:
        for c in configs:
            c._attn_implementation = ATTN_NAME
        yield
    finally:
        for c, name in zip(configs, before, strict=True):
            c._attn_implementation = name
        _GROUP.pop()
