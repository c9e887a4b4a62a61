"""Name -> function registries for advantage estimators and policy losses (as verl's register_adv_est).

An advantage estimator is `fn(groups: list[Group], **kw) -> list[list[list[float]]]`: one value per
segment, indexed [group][trajectory][segment]. A policy loss is `fn(logprobs, old_logprobs, advantages,
mask, **kw) -> (per_token_loss, stats)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_ADVANTAGES: dict[str, Callable[..., Any]] = {}
_LOSSES: dict[str, Callable[..., Any]] = {}


def _register(table: dict[str, Callable[..., Any]], kind: str, name: str) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        if name in table and table[name] is not fn:
            raise ValueError(f"{kind} {name!r} is already registered (by {table[name].__qualname__})")
        table[name] = fn
        return fn

    return deco


def _lookup(table: dict[str, Callable[..., Any]], kind: str, name: str) -> Callable[..., Any]:
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table)) or '(none)'}")
    return table[name]


# The built-in estimators and losses register when their module is imported; lookups import it
# lazily, so `get_advantage("grpo")` works without importing it first (and without importing torch).
def _load_advantages() -> None:
    from memrl.algorithms import advantages  # noqa: F401


def _load_losses() -> None:
    from memrl.algorithms import losses  # noqa: F401


def register_advantage(name: str) -> Callable[[F], F]:
    """Decorator: register an advantage estimator under `name`."""
    return _register(_ADVANTAGES, "advantage estimator", name)


def get_advantage(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as `name` (KeyError listing the known names otherwise)."""
    _load_advantages()
    return _lookup(_ADVANTAGES, "advantage estimator", name)


def advantage_names() -> list[str]:
    _load_advantages()
    return sorted(_ADVANTAGES)


def register_loss(name: str) -> Callable[[F], F]:
    """Decorator: register a policy loss under `name`."""
    return _register(_LOSSES, "policy loss", name)


def get_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as `name` (KeyError listing the known names otherwise)."""
    _load_losses()
    return _lookup(_LOSSES, "policy loss", name)


def loss_names() -> list[str]:
    _load_losses()
    return sorted(_LOSSES)
