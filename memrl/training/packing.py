"""Segments -> training rows -> micro-batches by a token budget -> padded tensors.

A row is one `Segment`: prompt ids + response ids, trained on the response tokens whose loss mask is
1. Rows are sorted by length and cut into micro-batches whose padded size (rows x longest row) stays
within `token_budget`, so rows of similar length share a micro-batch and padding stays small. Every
row lands in exactly one micro-batch (a row longer than the budget gets a micro-batch of its own);
no row is ever dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from memrl.types import Segment


@dataclass
class Row:
    """One training row: the token ids and, per response token, what the loss needs."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float
    trajectory_id: str
    weights: list[float] | None = None
    """Per-response-token loss weights (set by `set_loss_weights`); their sum over the batch is 1 for token-mean."""

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def rows_from_segments(segments: Sequence[Segment]) -> list[Row]:
    """One row per segment, token ids and logprobs exactly as the engine produced them."""
    rows = []
    for s in segments:
        assert s.loss_mask is not None
        rows.append(
            Row(list(s.prompt_ids), list(s.response_ids), list(s.loss_mask), list(s.response_logprobs),
                float(s.advantage or 0.0), s.trajectory_id)
        )
    return rows


def set_loss_weights(rows: Sequence[Row], mode: str) -> None:
    """Fix each row's per-token weights over the WHOLE batch (see algorithms.losses.loss_token_weights).

    Weights are decided before the batch is split, so the micro-batch losses sum to the full loss.
    """
    from memrl.algorithms.losses import loss_token_weights

    weights = loss_token_weights([r.loss_mask for r in rows], [r.trajectory_id for r in rows], mode)
    for r, w in zip(rows, weights, strict=True):
        r.weights = w


def pack_rows(rows: Sequence[Row], token_budget: int) -> list[list[int]]:
    """Indices of `rows` grouped into micro-batches whose padded size rows*max_len <= token_budget.

    Rows are taken longest first; each micro-batch grows while the budget allows. Every index appears
    exactly once.
    """
    if token_budget < 1:
        raise ValueError(f"pack_rows: token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(rows)), key=lambda i: (-rows[i].length, i))
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        n = rows[i].length
        new_max = max(cur_max, n)
        if cur and new_max * (len(cur) + 1) > token_budget:
            batches.append(cur)
            cur, new_max = [], n
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    return batches


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

    def to(self, device: str | torch.device) -> MicroBatch:
        """The same micro-batch on `device`."""
        if str(device) == "cpu":
            return self
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return MicroBatch(**moved)


def collate(rows: Sequence[Row], pad_id: int = 0) -> MicroBatch:
    """Pad a micro-batch of rows to its own longest row; response tokens carry mask/old logprob/weight."""
    b = len(rows)
    width = max(r.length for r in rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    att = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, width - 1))
    old = torch.zeros((b, width - 1))
    adv = torch.zeros((b, width - 1))
    wts = torch.zeros((b, width - 1))
    for i, r in enumerate(rows):
        seq = r.prompt_ids + r.response_ids
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        att[i, : len(seq)] = 1
        p, n = len(r.prompt_ids), len(r.response_ids)
        if n == 0:
            continue
        sl = slice(p - 1, p - 1 + n)
        mask[i, sl] = torch.tensor(r.loss_mask, dtype=torch.float32)
        old[i, sl] = torch.tensor(r.old_logprobs, dtype=torch.float32)
        adv[i, sl] = r.advantage
        if r.weights is not None:
            wts[i, sl] = torch.tensor(r.weights, dtype=torch.float32)
    return MicroBatch(ids, att, ids[:, 1:].clone(), mask, old, adv, wts, b, int(att.sum()))
