"""The optimizer side of one training rank, shared by the driver and the workers: the learning-rate
schedule, the weight-decay groups, and whether the update may leave out rows whose advantage is 0.

A leaf module (it imports only the config), so memrl.training.ranks.workers does not import the trainer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from memrl.training.config import TrainConfig


def lr_lambda(warmup: int) -> Callable[[int], float]:
    """Linear warm-up over `warmup` steps, then constant (MemAgent / verl default)."""
    return lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0


def decay_groups(model: torch.nn.Module, scope: str) -> Any:
    """The optimizer's parameters under `optim.weight_decay_scope`: "all" = every parameter in one group;
    "matrices" = Megatron-LM's rule (megatron/core/optimizer _get_param_groups): biases and 1-D parameters
    (norms) in a second group with weight decay 0. Only trainable parameters (LoRA: the adapter's)."""
    if scope == "all":
        return [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapter only
    if scope != "matrices":
        raise ValueError(f"unknown weight-decay scope {scope!r}; known: all, matrices")
    decay, plain = [], []
    for name, p in ((n, p) for n, p in model.named_parameters() if p.requires_grad):
        (plain if name.endswith(".bias") or p.ndim == 1 else decay).append(p)
    return [{"params": decay}, {"params": plain, "weight_decay": 0.0}]


def skips_zero_advantage(cfg: TrainConfig) -> bool:
    """Whether the update leaves out rows whose advantage is exactly 0 (`trainer.skip_zero_advantage`): only
    where that is exact, the built-in PPO loss with no KL, entropy or LLDS term."""
    a = cfg.algorithm
    return (cfg.trainer.skip_zero_advantage and a.loss == "ppo" and a.kl_coef == 0 and a.entropy_coef == 0
            and a.llds.coef == 0)
