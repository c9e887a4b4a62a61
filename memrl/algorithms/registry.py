"""Name -> function registries for advantage estimators and policy losses (as verl's register_adv_est).

An advantage estimator is `fn(groups: list[Group], **options) -> list[list[list[float]]]`: one value per
segment, indexed `[group][trajectory][segment]`. A policy loss is `fn(logprobs, old_logprobs, advantages,
mask, **options) -> (per_token_loss, stats)`. Each registers with an options dataclass whose fields are
its keyword options; an instance is the config section `algorithm.<registered name>`
(`memrl.training.algorithm_section.AlgorithmSection.options()`), so the trainer calls any registered estimator or loss
without knowing its name. A name may also be an import path "package.module:fn" of a function registered in
a user's module (`memrl.algorithms.base.registered_name`); `memrl.algorithms.base.fill_options` fills an options dataclass from any
object's same-named attributes.

The tables and decorators live in memrl.algorithms.base (what an implementation imports); this module
adds the lookups and imports the built-in implementations (so they are registered), so
`get_advantage("grpo")` works without importing them first. Dependencies run one way:
registry -> advantages / losses -> base.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memrl.algorithms import advantages as _advantages  # noqa: F401 - registers grpo, dcpo, rememr1
from memrl.algorithms import fold as _fold  # noqa: F401 - registers foldgrpo
from memrl.algorithms import losses as _losses  # noqa: F401 - registers ppo
from memrl.algorithms import remedies as _remedies  # noqa: F401 - registers clip_cov, kl_cov
from memrl.algorithms.base import (
    ADVANTAGE,
    ADVANTAGES,
    LOSS,
    LOSSES,
    OPTIONS,
    lookup,
    registered_name,
)

__all__ = ["advantage_name", "advantage_names", "advantage_options", "get_advantage", "get_loss", "loss_name",
           "loss_names", "loss_options"]


def advantage_options(name: str) -> type | None:
    """The options dataclass the estimator `name` registered with (None: it takes no options)."""
    return OPTIONS[(ADVANTAGE, advantage_name(name))]


def advantage_name(name: str) -> str:
    """The registered name of the estimator `name` (a name or an import path): its options' section."""
    get_advantage(name)
    return registered_name(ADVANTAGES, ADVANTAGE, name)


def loss_name(name: str) -> str:
    """The registered name of the loss `name` (a name or an import path): its options' section."""
    get_loss(name)
    return registered_name(LOSSES, LOSS, name)


def get_advantage(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as `name` (KeyError listing the known names otherwise)."""
    return lookup(ADVANTAGES, ADVANTAGE, name)


def advantage_names() -> list[str]:
    return sorted(ADVANTAGES)


def loss_options(name: str) -> type | None:
    """The options dataclass the loss `name` registered with (None: it takes no options)."""
    return OPTIONS[(LOSS, loss_name(name))]


def get_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as `name` (KeyError listing the known names otherwise)."""
    return lookup(LOSSES, LOSS, name)


def loss_names() -> list[str]:
    return sorted(LOSSES)
