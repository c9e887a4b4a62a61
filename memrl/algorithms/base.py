"""The registry tables and their decorators: what an estimator or loss module imports to register itself.

This module imports no estimator or loss, so the implementations (memrl.algorithms.advantages,
memrl.algorithms.losses, a user's own module) depend on it one way; memrl.algorithms.registry adds the
lookups that load the built-in ones on first use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from memrl.plugins import load_object

F = TypeVar("F", bound=Callable[..., Any])

ADVANTAGE = "advantage estimator"
LOSS = "policy loss"
MODEL_REWARD = "model-scored reward"

ADVANTAGES: dict[str, Callable[..., Any]] = {}
LOSSES: dict[str, Callable[..., Any]] = {}
MODEL_REWARDS: dict[str, Callable[..., Any]] = {}
"""Rewards the trainer's own model scores in the score stage (memrl.rewards.model_scored: InfoMem's)."""
OPTIONS: dict[tuple[str, str], type | None] = {}


def _register(table: dict[str, Callable[..., Any]], kind: str, name: str, options: type | None) -> Callable[[F], F]:
    if options is not None and not dataclasses.is_dataclass(options):
        raise TypeError(f"{kind} {name!r}: options must be a dataclass, got {options!r}")

    def deco(fn: F) -> F:
        if name in table and table[name] is not fn:
            raise ValueError(f"{kind} {name!r} is already registered (by {table[name].__qualname__})")
        table[name] = fn
        OPTIONS[(kind, name)] = options
        return fn

    return deco


def register_advantage(name: str, options: type | None = None) -> Callable[[F], F]:
    """Decorator: register an advantage estimator under `name`, with its options dataclass (set as
    algorithm.<name>.<field>). In a user's module it is what `algorithm.name=package.module:fn` may name."""
    return _register(ADVANTAGES, ADVANTAGE, name, options)


def register_loss(name: str, options: type | None = None) -> Callable[[F], F]:
    """Decorator: register a policy loss under `name`, with its options dataclass (set as
    algorithm.<name>.<field>); `algorithm.loss=package.module:fn` may name one from a user's module."""
    return _register(LOSSES, LOSS, name, options)


def register_model_reward(name: str, options: type | None = None) -> Callable[[F], F]:
    """Decorator: register a reward scored by the trainer's model (memrl.rewards.model_scored) under `name`,
    with its options dataclass (algorithm.<name>.<field>); `algorithm.model_reward=package.module:fn` may
    name one from a user's module."""
    return _register(MODEL_REWARDS, MODEL_REWARD, name, options)


FIELDS = {ADVANTAGE: "algorithm.name", LOSS: "algorithm.loss", MODEL_REWARD: "algorithm.model_reward"}
"""The config field that names each kind."""
DECORATORS = {ADVANTAGE: "register_advantage", LOSS: "register_loss", MODEL_REWARD: "register_model_reward"}


def registered_name(table: dict[str, Callable[..., Any]], kind: str, name: str) -> str:
    """The name `name` is registered under: itself, or for an import path "package.module:attr" the name the
    function it names registered with (its options nest under algorithm.<that name>). Importing the module
    registers what it decorates; an attribute that is not a registered function is a one-line ConfigError
    naming the field (nothing is called)."""
    if ":" not in name:
        return name

    deco = DECORATORS[kind]
    fn = load_object(name, FIELDS[kind], f"a registered {kind}", lambda o: any(f is o for f in table.values()),
                     f"only functions marked with @memrl.algorithms.base.{deco}(name, Options) may be named")
    return next(n for n, f in table.items() if f is fn)


def lookup(table: dict[str, Callable[..., Any]], kind: str, name: str) -> Callable[..., Any]:
    """`table[name]` (`name` a registered name or an import path, see `registered_name`), or a KeyError
    listing the names registered so far."""
    name = registered_name(table, kind, name)
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table)) or '(none)'}")
    return table[name]


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
