"""Name -> function registries for advantage estimators and policy losses (as verl's register_adv_est).

An advantage estimator is `fn(groups: list[Group], **options) -> list[list[list[float]]]`: one value per
segment, indexed [group][trajectory][segment]. A policy loss is `fn(logprobs, old_logprobs, advantages,
mask, **options) -> (per_token_loss, stats)`. Each registers with an options dataclass whose fields are
its keyword options; `fill_options` fills one from the `algorithm.*` config section (same field names),
so the trainer calls any registered estimator or loss without knowing its name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_ADVANTAGES: dict[str, Callable[..., Any]] = {}
_LOSSES: dict[str, Callable[..., Any]] = {}
_OPTIONS: dict[tuple[str, str], type | None] = {}


def _register(table: dict[str, Callable[..., Any]], kind: str, name: str, options: type | None) -> Callable[[F], F]:
    if options is not None and not dataclasses.is_dataclass(options):
        raise TypeError(f"{kind} {name!r}: options must be a dataclass, got {options!r}")

    def deco(fn: F) -> F:
        if name in table and table[name] is not fn:
            raise ValueError(f"{kind} {name!r} is already registered (by {table[name].__qualname__})")
        table[name] = fn
        _OPTIONS[(kind, name)] = options
        return fn

    return deco


def fill_options(cls: type | None, section: Any, where: str = "algorithm") -> Any:
    """An instance of the options dataclass `cls`, each field taken from `section`'s field of the same
    name (None when `cls` is None). A field the section lacks is an error naming it."""
    if cls is None:
        return None
    missing = [f.name for f in dataclasses.fields(cls) if not hasattr(section, f.name)]
    if missing:
        raise ValueError(f"{cls.__name__} needs {', '.join(where + '.' + m for m in missing)}, which the "
                         f"{type(section).__name__} config does not have; add the field there")
    return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)})


def options_kwargs(opts: Any) -> dict[str, Any]:
    """The keyword arguments an options dataclass instance stands for ({} for None)."""
    return {} if opts is None else {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}


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


def register_advantage(name: str, options: type | None = None) -> Callable[[F], F]:
    """Decorator: register an advantage estimator under `name`, with its options dataclass."""
    return _register(_ADVANTAGES, "advantage estimator", name, options)


def advantage_options(name: str) -> type | None:
    """The options dataclass the estimator `name` registered with (None: it takes no options)."""
    get_advantage(name)
    return _OPTIONS[("advantage estimator", name)]


def get_advantage(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as `name` (KeyError listing the known names otherwise)."""
    _load_advantages()
    return _lookup(_ADVANTAGES, "advantage estimator", name)


def advantage_names() -> list[str]:
    _load_advantages()
    return sorted(_ADVANTAGES)


def register_loss(name: str, options: type | None = None) -> Callable[[F], F]:
    """Decorator: register a policy loss under `name`, with its options dataclass."""
    return _register(_LOSSES, "policy loss", name, options)


def loss_options(name: str) -> type | None:
    """The options dataclass the loss `name` registered with (None: it takes no options)."""
    get_loss(name)
    return _OPTIONS[("policy loss", name)]


def get_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as `name` (KeyError listing the known names otherwise)."""
    _load_losses()
    return _lookup(_LOSSES, "policy loss", name)


def loss_names() -> list[str]:
    _load_losses()
    return sorted(_LOSSES)
