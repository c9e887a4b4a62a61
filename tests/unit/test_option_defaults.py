"""One source for the algorithm defaults: the options dataclasses (memrl.algorithms.options).

A value that can be given a default in several places (an options dataclass, the estimator's or loss's
keyword default, a math function's keyword default, `AlgorithmSection` of `memrl train`) must have the
same default in every place that sets one; `default_conflicts` lists the places that disagree.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from memrl.algorithms import advantages, losses, options
from memrl.algorithms.base import ADVANTAGES, LOSSES, OPTIONS
from memrl.algorithms.registry import advantage_names, loss_names
from memrl.training.config import AlgorithmSection

# The library's own functions whose keyword parameters set an algorithm default, and the name of the
# AlgorithmSection / options field each parameter stands for where it differs.
MATH_FUNCTIONS: list[tuple[Callable[..., Any], dict[str, str]]] = [
    (advantages.grpo_advantages, {}),
    (advantages.rememr1_advantages, {}),
    (advantages.assign_advantages, {}),
    (losses.kl_penalty, {"kind": "kl_kind"}),
    (losses.loss_token_weights, {"mode": "loss_agg"}),
    (losses.agg_loss, {"mode": "loss_agg"}),
]


def _field_defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _keyword_defaults(fn: Callable[..., Any], rename: dict[str, str]) -> dict[str, Any]:
    return {rename.get(p.name, p.name): p.default for p in inspect.signature(fn).parameters.values()
            if p.default is not inspect.Parameter.empty}


def default_places(section: type = AlgorithmSection,
                   registered: list[tuple[str, Callable[..., Any], type | None]] | None = None,
                   functions: list[tuple[Callable[..., Any], dict[str, str]]] = MATH_FUNCTIONS) -> dict[str, list]:
    """{field name: [(place, default), ...]} over every place that sets a default for that name."""
    if registered is None:
        advantage_names(), loss_names()  # load the built-in estimators and losses
        registered = [(f"{kind} {name}", fn, OPTIONS[(kind, name)])
                      for kind, table in (("advantage estimator", ADVANTAGES), ("policy loss", LOSSES))
                      for name, fn in table.items() if fn.__module__.startswith("memrl.")]
    places: dict[str, list] = {}

    def add(place: str, defaults: dict[str, Any]) -> None:
        for name, value in defaults.items():
            places.setdefault(name, []).append((place, value))

    add(section.__name__, _field_defaults(section))
    for what, fn, opts in registered:
        if opts is not None:
            add(f"{opts.__name__} ({what})", _field_defaults(opts))
        add(f"{fn.__qualname__} ({what})", _keyword_defaults(fn, {}))
    for fn, rename in functions:
        add(f"{fn.__module__}.{fn.__qualname__}", _keyword_defaults(fn, rename))
    return places


def default_conflicts(**kw: Any) -> list[str]:
    """One line per name set in two places with different defaults."""
    out = []
    for name, where in sorted(default_places(**kw).items()):
        if len({repr(v) for _, v in where}) > 1:
            out.append(f"{name}: " + ", ".join(f"{place}={v!r}" for place, v in where))
    return out


def test_every_algorithm_default_is_set_to_one_value():
    assert default_conflicts() == []


def test_the_shared_names_are_really_compared():
    """The check sees every place: norm_by_std in both estimators' options (the sections algorithm.grpo and
    algorithm.rememr1 are those dataclasses) and functions."""
    places = dict(default_places())
    assert [p for p, _ in places["norm_by_std"]] == [
        "GRPOOptions (advantage estimator grpo)", "grpo_estimator (advantage estimator grpo)",
        "ReMemR1Options (advantage estimator rememr1)", "rememr1_estimator (advantage estimator rememr1)",
        "memrl.algorithms.advantages.rememr1_advantages",
    ]
    assert {v for _, v in places["norm_by_std"]} == {False}
    assert {v for _, v in places["loss_agg"]} == {"token-mean"}
    assert {v for _, v in places["kl_kind"]} == {"low_var_kl"}
    assert {v for _, v in places["dual_clip_c"]} == {3.0}
    # 4 options (grpo, dcpo, rememr1, foldgrpo), their 4 estimators, grpo_advantages, rememr1_advantages;
    # REINFORCE++'s whitening epsilon (1e-8, verl's masked_whiten) is another setting: whiten_eps
    assert len(places["eps"]) == 10
    assert {v for _, v in places["whiten_eps"]} == {1e-8}
    assert {type(v) for _, v in places["grpo"]} == {options.GRPOOptions}  # algorithm.grpo is the options class


def test_a_default_set_twice_with_different_values_is_reported():
    @dataclasses.dataclass
    class Section:
        norm_by_std: bool = True
        alpha: float = 0.8

    @dataclasses.dataclass
    class Opts:
        alpha: float = 0.5

    def estimator(groups: Any, alpha: float = 0.5, norm_by_std: bool = True) -> None: ...

    def math(x: float, norm_by_std: bool = False) -> None: ...

    assert default_conflicts(section=Section, registered=[("advantage estimator x", estimator, Opts)],
                             functions=[(math, {})]) == [
        "alpha: Section=0.8, Opts (advantage estimator x)=0.5, "
        "test_a_default_set_twice_with_different_values_is_reported.<locals>.estimator (advantage estimator x)=0.5",
        "norm_by_std: Section=True, test_a_default_set_twice_with_different_values_is_reported.<locals>.estimator "
        "(advantage estimator x)=True, "
        f"{__name__}.test_a_default_set_twice_with_different_values_is_reported.<locals>.math=False",
    ]


def test_memrl_train_keeps_its_grpo_default_and_the_options_are_its_source():
    """What `memrl train` ran before the defaults had one source (AlgorithmSection's values) is what runs."""
    a = AlgorithmSection()
    assert (a.grpo.norm_by_std, a.grpo.eps, a.grpo.credit, a.rememr1.alpha, a.rememr1.state_term) == (
        False, 1e-6, "broadcast", 0.8, "paper")
    assert (a.ppo.clip_low, a.ppo.clip_high, a.ppo.dual_clip_c) == (0.2, 0.2, 3.0)
    assert options.GRPOOptions() == options.GRPOOptions(norm_by_std=False, eps=1e-6, credit="broadcast")
    assert advantages.GRPOOptions is options.GRPOOptions and losses.PPOOptions is options.PPOOptions


@pytest.mark.parametrize("fn", [advantages.grpo_advantages])
def test_grpo_math_takes_norm_by_std_explicitly(fn: Callable[..., Any]):
    with pytest.raises(TypeError, match="norm_by_std"):
        fn([1.0, 0.0], ["g", "g"])
