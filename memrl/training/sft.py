"""Cold-start SFT on workflow traces: the same Segment rows and loss masks as RL, trained with the
token-mean negative log-likelihood of the masked response tokens.

Traces come from running the workflow with a demonstrator engine (e.g. a `ScriptedEngine` whose
script is `memrl.demonstrators.RecentFactsRule`), so SFT rows are built exactly as RL rows are.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from memrl.training.packing import collate, pack_rows, rows_from_segments, set_loss_weights
from memrl.training.policy import sft_micro_loss
from memrl.types import Segment

log = logging.getLogger(__name__)


@dataclass
class SFTConfig:
    """Supervised cold start: optimizer and batching settings."""

    epochs: int = 1
    """Passes over the traces."""
    batch_rows: int = 64
    """Rows (segments) per optimizer step."""
    lr: float = 1e-3
    """AdamW peak learning rate (cosine decay to 10% after `warmup_steps`)."""
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    token_budget: int = 8192
    """Padded tokens per micro-batch (gradient accumulation over micro-batches)."""
    loss_agg: str = "token-mean"
    """Aggregation over the tokens of a batch (see algorithms.losses.loss_token_weights)."""
    seed: int = 0


def sft_train(
    model: torch.nn.Module,
    segments: Sequence[Segment],
    cfg: SFTConfig,
    pad_id: int = 0,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> list[float]:
    """Train `model` in place (on its own device) on the segments' masked response tokens; returns the
    loss of every step."""
    rows = rows_from_segments(segments)
    if not rows:
        raise ValueError("sft_train: no segments to train on")
    rng = random.Random(cfg.seed)
    device = next(model.parameters()).device  # batches are built on the CPU; the model may be elsewhere
    steps_per_epoch = max(1, (len(rows) + cfg.batch_rows - 1) // cfg.batch_rows)
    total = steps_per_epoch * cfg.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.warmup_steps, total))
    model.train()
    losses: list[float] = []
    step = 0
    for _ in range(cfg.epochs):
        order = list(range(len(rows)))
        rng.shuffle(order)
        for b in range(0, len(order), cfg.batch_rows):
            t0 = time.perf_counter()
            batch = [rows[i] for i in order[b : b + cfg.batch_rows]]
            set_loss_weights(batch, cfg.loss_agg)
            opt.zero_grad(set_to_none=True)
            loss = 0.0
            tokens = 0
            for idx in pack_rows(batch, cfg.token_budget):
                mb = collate([batch[i] for i in idx], pad_id).to(device)
                part = sft_micro_loss(model, mb)
                part.loss.backward()
                loss += float(part.loss.detach())
                tokens += mb.num_tokens
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            losses.append(loss)
            step += 1
            if on_step is not None:
                dt = time.perf_counter() - t0
                on_step(step, total, {"sft/loss": loss, "sft/grad_norm": float(gn), "sft/lr": sched.get_last_lr()[0],
                                      "sft/tokens_per_s": tokens / max(dt, 1e-9)})
    model.eval()
    return losses


def lr_factor(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to `floor` at `total`."""
    import math

    if warmup and step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
