"""Lookups of the model-scored rewards (memrl.rewards.model_scored: the contract; registered with
memrl.algorithms.base.register_model_reward); importing this module registers the built-in one, infomem."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memrl.algorithms.base import (
    MODEL_REWARD,
    MODEL_REWARDS,
    OPTIONS,
    lookup,
    options_kwargs,
    registered_name,
)
from memrl.rewards import memory_gain as _memory_gain  # noqa: F401 - registers infomem
from memrl.rewards.model_scored import NONE, MemoryPrompts, ModelScored, Scorer

__all__ = ["NONE", "get_model_reward", "model_reward_name", "model_reward_names", "model_reward_options", "score_with"]


def model_reward_names() -> list[str]:
    """The values algorithm.model_reward admits by name: none and the registered rewards."""
    return [NONE, *sorted(MODEL_REWARDS)]


def get_model_reward(name: str) -> Callable[..., ModelScored]:
    """The model-scored reward registered as `name` (a name or an import path; KeyError listing the names)."""
    return lookup(MODEL_REWARDS, MODEL_REWARD, name)


def model_reward_name(name: str) -> str:
    """The registered name of `name` (its options' section algorithm.<name>)."""
    get_model_reward(name)
    return registered_name(MODEL_REWARDS, MODEL_REWARD, name)


def model_reward_options(name: str) -> type | None:
    """The options dataclass the model-scored reward `name` registered with (None: it takes none)."""
    return OPTIONS[(MODEL_REWARD, model_reward_name(name))]


def score_with(name: str, options: Any, groups: Sequence[Any], scorer: Scorer, memory_prompts: MemoryPrompts | None,
               tokenizer: Any) -> ModelScored:
    """Run the model-scored reward `name` with its options instance (or None) and check the shape it returns."""
    out = get_model_reward(name)(groups, scorer=scorer, memory_prompts=memory_prompts, tokenizer=tokenizer,
                                 **options_kwargs(options))
    shape = [len(g.trajectories) for g in groups]
    if [len(r) for r in out.rewards] != shape or [len(v) for v in out.values] != shape:
        raise ValueError(f"model-scored reward {name!r} returned rewards for {[len(r) for r in out.rewards]} "
                         f"trajectories per group, expected {shape}")
    return out
