"""Segments -> one loss weight per row -> rank shares -> micro-batches by a token budget -> padded tensors.

A row is one `Segment`: prompt ids + response ids, trained on the response tokens whose loss mask is
1. The driver weighs the rows of a mini-batch once (`weigh`: one weight per row over the WHOLE
mini-batch, memrl.algorithms.losses.row_weights) and cuts it into token-balanced shares, one per rank
(`split`); a rank receives only its share. Within a share, rows are sorted by length and cut into
micro-batches whose padded size (rows x longest row) stays within `token_budget`, so rows of similar
length share a micro-batch and padding stays small. Every row lands in exactly one micro-batch (a row
longer than the budget gets a micro-batch of its own); no row is ever dropped. `collate` builds the
tensors straight from the segments' ids, masks, logprobs and advantage and the row weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from memrl.algorithms.losses import row_weights
from memrl.types import Segment


@dataclass
class TrainBatch:
    """The rows of one optimizer step, or one rank's share of them: segments, each with its loss weight
    (fixed over the whole mini-batch, so micro-batch and rank losses sum to the mini-batch's loss)."""

    segments: list[Segment]
    weights: list[float]
    batch_rows: int = field(default=-1)
    """Rows of the whole mini-batch (every rank's share); `weigh` and `split` set it (-1: len(segments))."""

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.segments):
            raise ValueError(f"TrainBatch: {len(self.segments)} segments but {len(self.weights)} weights")
        if self.batch_rows < 0:
            self.batch_rows = len(self.segments)

    def __len__(self) -> int:
        return len(self.segments)

    def weight_sum(self) -> float:
        """Sum of the weights over the trained tokens (row weight x its trained tokens, token by token)."""
        return sum(sum(w if v else 0.0 for v in _mask(s)) for s, w in zip(self.segments, self.weights, strict=True))


def _mask(s: Segment) -> list[int]:
    assert s.loss_mask is not None  # Segment fills it in
    return s.loss_mask


def weigh(segments: Sequence[Segment], mode: str) -> TrainBatch:
    """The mini-batch `segments` with one loss weight per row over the whole of it (`mode`: algorithm.loss_agg,
    memrl.algorithms.losses.row_weights)."""
    segs = list(segments)
    return TrainBatch(segs, row_weights([_mask(s) for s in segs], [s.trajectory_id for s in segs], mode))


def weigh_shares(shares: Sequence[Sequence[Segment]], mode: str, world_size: int) -> TrainBatch:
    """One optimizer step under the MemAgent / ReMemR1 forks' rule (trainer.loss_weights=per_rank): each
    rank's `shares[r]` weighed over itself alone (row_weights), every weight divided by `world_size` W, the
    rows concatenated in rank order. token-mean: a row's weight is 1 / (W x trained tokens of its rank's
    share), so the step loss is (1/W) x the sum over ranks of each share's token mean (dp_actor.py
    update_policy scales each micro-batch's agg_loss by its tokens / the rank's tokens; FSDP averages the
    ranks' gradients, ranks without rows included)."""
    segs: list[Segment] = []
    weights: list[float] = []
    for share in shares:
        segs += share
        weights += [w / world_size for w in row_weights([_mask(s) for s in share],
                                                        [s.trajectory_id for s in share], mode)]
    return TrainBatch(segs, weights)


def split_rows(segments: Sequence[Segment], n: int) -> list[list[int]]:
    """Row indices for each of `n` ranks, balanced by tokens: longest row first to the rank with the
    fewest tokens so far (ties to the lower rank). Deterministic; every index appears once; each rank's
    indices in order."""
    shares: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(segments)), key=lambda i: (-segments[i].num_tokens, i)):
        r = min(range(n), key=lambda k: (load[k], k))
        shares[r].append(i)
        load[r] += segments[i].num_tokens
    return [sorted(s) for s in shares]


def split(batch: TrainBatch, n: int) -> list[TrainBatch]:
    """`batch` cut into `n` token-balanced shares (`split_rows`), each row keeping its weight."""
    return [TrainBatch([batch.segments[i] for i in idx], [batch.weights[i] for i in idx], batch.batch_rows)
            for idx in split_rows(batch.segments, n)]


def blank_row(pad_id: int = 0) -> Segment:
    """A two-token row that trains nothing (weight 0): a rank with fewer micro-batches than the others
    runs it so that every rank joins the same number of FSDP collectives."""
    return Segment([pad_id], [pad_id], [0.0], loss_mask=[0])


def pack_rows(segments: Sequence[Segment], token_budget: int) -> list[list[int]]:
    """Indices of `segments` grouped into micro-batches whose padded size rows*max_len <= token_budget.

    Rows are taken longest first; each micro-batch grows while the budget allows. Every index appears
    exactly once.
    """
    if token_budget < 1:
        raise ValueError(f"pack_rows: token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(segments)), key=lambda i: (-segments[i].num_tokens, i))
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        n = segments[i].num_tokens
        new_max = max(cur_max, n)
        if cur and new_max * (len(cur) + 1) > token_budget:
            batches.append(cur)
            cur, new_max = [], n
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    return batches


@dataclass(frozen=True)
class SharePlan:
    """Which rows of a micro-batch share which prefix (indices into the micro-batch's rows): made by
    memrl.training.update.prefix_sharing.plan_shares, which forwards each group's prefix once."""

    groups: tuple[tuple[int, ...], ...]
    """Rows of each group, >= 2 each, disjoint."""
    prefix: tuple[int, ...]
    """Tokens of each group's shared prefix, forwarded once."""
    lengths: tuple[int, ...]
    """Tokens of each row."""

    @property
    def row_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def forwarded_tokens(self) -> int:
        """Prefixes once plus every row's own tokens after its prefix."""
        return self.row_tokens - sum((len(g) - 1) * p for g, p in zip(self.groups, self.prefix, strict=True))


@dataclass
class MicroBatch:
    """Right-padded tensors for one micro-batch. Per-token tensors are [B, L-1], aligned with the
    logits that PREDICT token t+1 (position t), so index t of `targets` is input_ids[:, t+1]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    num_rows: int
    num_tokens: int
    prox_logprobs: torch.Tensor | None = None
    """The trainer's recomputed old logprobs (Segment.old_logprobs) when every row has them, else None."""
    position_ids: torch.Tensor | None = None
    """A sequence-parallel shard's global positions (memrl.training.update.ulysses.shard), else None (0, 1, ...).
    A shard's per-token tensors are as wide as its ids: its last column's target opens the next shard."""
    share: SharePlan | None = None
    """trainer.prefix_sharing: which rows share which prefix (memrl.training.update.prefix_sharing), else None."""

    def to(self, device: str | torch.device) -> MicroBatch:
        """The same micro-batch on `device`."""
        if str(device) == "cpu":
            return self
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return MicroBatch(**moved)


def collate(segments: Sequence[Segment], weights: Sequence[float] | None = None, pad_id: int = 0) -> MicroBatch:
    """Pad a micro-batch of rows to its own longest row; response tokens carry mask / old logprob /
    advantage / weight (the row's weight on its trained tokens; None: all weights 0)."""
    b = len(segments)
    width = max(s.num_tokens for s in segments)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    att = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, width - 1))
    old = torch.zeros((b, width - 1))
    adv = torch.zeros((b, width - 1))
    wts = torch.zeros((b, width - 1))
    prox = torch.zeros((b, width - 1)) if all(s.old_logprobs is not None for s in segments) else None
    for i, s in enumerate(segments):
        seq = s.prompt_ids + s.response_ids
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        att[i, : len(seq)] = 1
        p, n = len(s.prompt_ids), len(s.response_ids)
        if n == 0:
            continue
        sl = slice(p - 1, p - 1 + n)
        mask[i, sl] = torch.tensor(_mask(s), dtype=torch.float32)
        old[i, sl] = torch.tensor(s.response_logprobs, dtype=torch.float32)
        if prox is not None:
            prox[i, sl] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        if s.token_advantages is not None:  # token-level advantages (FoldGRPO's process rewards)
            adv[i, sl] = torch.tensor(s.token_advantages, dtype=torch.float32)
        else:
            adv[i, sl] = float(s.advantage or 0.0)
        if weights is not None:
            wts[i, sl] = mask[i, sl] * weights[i]  # the row's weight (as float32) on its trained tokens, 0 elsewhere
    return MicroBatch(ids, att, ids[:, 1:].clone(), mask, old, adv, wts, b, int(att.sum()), prox)
