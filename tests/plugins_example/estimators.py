"""An advantage estimator and a policy loss with options, written outside memrl and named by import path:

    memrl train algorithm.name=plugins_example.estimators:scaled_grpo algorithm.scaled_grpo.scale=0.25
    memrl train algorithm.loss=plugins_example.estimators:clipped_ppo algorithm.clipped_ppo.clip=0.1

Their options nest under the names they register with (`algorithm.scaled_grpo.*`, `algorithm.clipped_ppo.*`),
as the built-ins' do (`algorithm.grpo.*`, `algorithm.ppo.*`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memrl.algorithms.base import register_advantage, register_loss
from memrl.config import valid
from memrl.types import Group


@dataclass
class ScaledGRPOOptions:
    """Options of scaled_grpo (algorithm.scaled_grpo.*)."""

    scale: float = valid(1.0, gt=0)
    """Every segment's advantage is GRPO's (mean-centred, broadcast) times this."""
    offset: float = valid(0.0, ge=-10, le=10)
    """Added to every advantage after scaling (a visible trace in the logged advantage/mean)."""


@register_advantage("scaled_grpo", ScaledGRPOOptions)
def scaled_grpo(groups: Sequence[Group], scale: float = ScaledGRPOOptions.scale,
                offset: float = ScaledGRPOOptions.offset) -> list[list[list[float]]]:
    """GRPO (memrl's default options) with every value times `scale`, plus `offset`."""
    from memrl.algorithms.advantages import grpo_estimator

    return [[[a * scale + offset for a in per_traj] for per_traj in per_group] for per_group in grpo_estimator(groups)]


@dataclass
class ClippedPPOOptions:
    """Options of clipped_ppo (algorithm.clipped_ppo.*)."""

    clip: float = valid(0.2, gt=0, lt=1)
    """The symmetric PPO clip range (clip_low = clip_high = clip, no dual clip)."""


@register_loss("clipped_ppo", ClippedPPOOptions)
def clipped_ppo(logprobs: Any, old_logprobs: Any, advantages: Any, mask: Any,
                clip: float = ClippedPPOOptions.clip) -> Any:
    """memrl's PPO clip loss with one symmetric range."""
    from memrl.algorithms.losses import ppo_clip_loss

    return ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_low=clip, clip_high=clip, dual_clip_c=None)


def not_registered(groups: Sequence[Group], scale: float = 1.0) -> list[list[list[float]]]:
    """Looks like an estimator but is not marked: a config may not name it."""
    raise AssertionError("an unmarked function was called")
