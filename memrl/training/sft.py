"""Cold-start SFT on workflow traces: the same Segment rows and loss masks as RL, trained with the
token-mean negative log-likelihood of the masked response tokens.

Traces come from running the workflow with a demonstrator engine (e.g. a `ScriptedEngine` whose
script is `memrl.demonstrators.RecentFactsDemonstrator`), so SFT rows are built exactly as RL rows are.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memrl.config import MAX_COEF, MAX_COUNT, MAX_LR, MAX_SEED, MAX_TOKENS, check_config, valid
from memrl.errors import UserError
from memrl.precision import autocast
from memrl.quiet import hf_progress_off, peft_rename_warning_off
from memrl.training.monitor.metrics_log import MetricsLogger
from memrl.training.update.packing import collate, pack_rows, weigh
from memrl.training.update.policy import clip_norm, sft_micro_loss
from memrl.types import Segment

log = logging.getLogger(__name__)


@dataclass
class SFTConfig:
    """Supervised cold start: optimizer and batching settings."""

    epochs: int = valid(1, ge=1, le=MAX_COUNT)
    """Passes over the traces."""
    batch_rows: int = valid(64, ge=1, le=MAX_COUNT)
    """Rows (segments) per optimizer step."""
    lr: float = valid(1e-3, gt=0, le=MAX_LR)
    """AdamW peak learning rate (cosine decay to 10% after `warmup_steps`)."""
    warmup_steps: int = valid(10, ge=0, le=MAX_COUNT)
    weight_decay: float = valid(0.0, ge=0, le=MAX_COEF)
    grad_clip: float = valid(1.0, ge=0, le=MAX_COEF, note="0 = no clipping")
    """Clip the gradient norm to this before every step; 0 = no clipping."""
    token_budget: int = valid(8192, ge=1, le=MAX_TOKENS)
    """Padded tokens per micro-batch (gradient accumulation over micro-batches)."""
    logits_chunk_tokens: int = valid(0, ge=0, le=MAX_TOKENS, note="0 = full logits")
    """As trainer.logits_chunk_tokens: log-probabilities from that many tokens' logits at a time."""
    loss_agg: str = valid("token-mean", choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                                 "traj-mean"))
    """Aggregation over the tokens of a batch (see algorithms.losses.loss_token_weights)."""
    lr_floor: float = valid(0.1, ge=0, le=1)
    """The cosine decay ends at lr * lr_floor (1.0 = constant after warm-up)."""
    shuffle: bool = True
    """Shuffle the rows every epoch (False: batches are consecutive rows, e.g. rows made in same-length blocks)."""
    seed: int = valid(0, ge=0, le=MAX_SEED)

    def total_steps(self, num_rows: int) -> int:
        """Optimizer steps `sft_train` takes over `num_rows` rows."""
        return max(1, (num_rows + self.batch_rows - 1) // self.batch_rows) * self.epochs


def sft_train(
    model: torch.nn.Module,
    segments: Sequence[Segment],
    cfg: SFTConfig,
    pad_id: int = 0,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
    compute: torch.dtype | None = None,
) -> list[float]:
    """Train `model` in place (on its own device) on the segments' masked response tokens; returns the
    loss of every step. `compute` (model.compute_dtype): the forwards under autocast in that dtype over the
    model's own (master) weights, the backward outside it."""
    check_config(cfg, "sft")  # also a config built in code: never a negative clip or epoch count
    rows = list(segments)
    if not rows:
        raise ValueError("sft_train: no segments to train on")
    rng = random.Random(cfg.seed)
    device = next(model.parameters()).device  # batches are built on the CPU; the model may be elsewhere
    weights = next(model.parameters()).dtype
    total = cfg.total_steps(len(rows))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.warmup_steps, total, cfg.lr_floor))
    model.train()
    losses: list[float] = []
    step = 0
    for _ in range(cfg.epochs):
        order = list(range(len(rows)))
        if cfg.shuffle:
            rng.shuffle(order)
        for b in range(0, len(order), cfg.batch_rows):
            t0 = time.perf_counter()
            batch = weigh([rows[i] for i in order[b : b + cfg.batch_rows]], cfg.loss_agg)
            opt.zero_grad(set_to_none=True)
            loss = 0.0
            tokens = 0
            for idx in pack_rows(batch.segments, cfg.token_budget):
                mb = collate([batch.segments[i] for i in idx], [batch.weights[i] for i in idx], pad_id).to(device)
                with autocast(device, compute, weights):
                    part = sft_micro_loss(model, mb, cfg.logits_chunk_tokens)
                part.loss.backward()
                loss += float(part.loss.detach())
                tokens += mb.num_tokens
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm(cfg.grad_clip))
            if not (math.isfinite(loss) and math.isfinite(float(gn))):  # before the step: no weight changes
                raise UserError(f"sft step {step + 1}: training diverged (sft/loss={loss}, sft/grad_norm={float(gn)}); "
                                "stopped without saving (lower sft.lr or check the data)")
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


def sft_train_logged(model: torch.nn.Module, tokenizer: Any, segments: Sequence[Segment], cfg: SFTConfig,
                     log_dir: str | os.PathLike, *, desc: str = "sft", progress: bool = True,
                     tensorboard: bool = True, save_dir: str | os.PathLike | None = None,
                     compute: torch.dtype | None = None) -> list[float]:
    """`sft_train` with a progress bar and metrics.jsonl in `log_dir` (one line per step); the model and
    tokenizer are saved to `save_dir` when given. Returns the per-step losses."""
    logger = MetricsLogger(log_dir, tensorboard=tensorboard, progress_total=cfg.total_steps(len(segments)),
                           progress=progress, desc=desc)
    try:
        losses = sft_train(model, segments, cfg, pad_id=tokenizer.pad_token_id or 0,
                           on_step=lambda s, n, m: logger.log(s, m), compute=compute)
    finally:
        logger.close()
    if save_dir is not None:
        with hf_progress_off(), peft_rename_warning_off():  # a LoRA policy saves through peft
            model.save_pretrained(save_dir, safe_serialization=True)
        tokenizer.save_pretrained(save_dir)
    return losses


def copy_warmup_segments(token_ids: Sequence[int], rows: int, min_len: int = 8, max_len: int = 40,
                         block: int = 1, seed: int = 0) -> list[Segment]:
    """Rows that teach a model trained from scratch to copy by content (induction): a random sequence of
    `token_ids` (length uniform in [min_len, max_len]) followed by itself, trained on the repeat after its
    first token. Variable lengths matter: at one fixed length a tiny model copies by a fixed offset
    instead, which does not carry over to looking a fact up in a context (docs/concepts/memact.md). `block`
    consecutive rows share a length (train them unshuffled in batches of `block`: no padding)."""
    if not token_ids or not 1 < min_len <= max_len or block < 1:
        raise ValueError(f"copy_warmup_segments: need token ids, 1 < min_len <= max_len and block >= 1, got "
                         f"{len(token_ids)} ids, {min_len}..{max_len}, block {block}")
    rng = random.Random(f"copy-warmup:{seed}")
    out = []
    n = min_len
    for r in range(rows):
        if r % block == 0:
            n = rng.randint(min_len, max_len)
        seq = [rng.choice(token_ids) for _ in range(n)]
        out.append(Segment(prompt_ids=seq + seq[:1], response_ids=seq[1:], response_logprobs=[0.0] * (n - 1),
                           loss_mask=[1] * (n - 1), step=0, info={"kind": "copy_warmup"}))
    return out


def lr_factor(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to `floor` at `total`."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
