"""memrl.eval.stats: the one mean ± SE statistic and the one table cell (package and benchmarks)."""

from __future__ import annotations

import math

import pytest

from memrl.eval.evaluator import mean_and_se
from memrl.eval.stats import EMPTY, cell, group, group_stats, nest, stat


def test_stat_by_hand():
    # 1, 0, .5, .5: mean .5, squared deviations .25 + .25 = .5; sd sqrt(.5 / 3), se sqrt(.5 / 3 / 4) = sqrt(1/24)
    s = stat([1.0, 0.0, 0.5, 0.5])
    assert s["mean"] == 0.5 and s["n"] == 4 and s["values"] == [1.0, 0.0, 0.5, 0.5]
    assert s["sd"] == pytest.approx(math.sqrt(0.5 / 3)) and s["se"] == pytest.approx(math.sqrt(1 / 24))
    # ddof 0 over 0/1 values: the binomial sqrt(p (1 - p) / n) = sqrt(.75 * .25 / 4)
    b = stat([1.0, 0.0, 1.0, 1.0], ddof=0)
    assert b["se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 4)) and b["sd"] == pytest.approx(math.sqrt(0.75 * 0.25))
    with pytest.raises(ValueError, match="ddof"):
        stat([1.0, 0.0], ddof=2)


def test_se_is_computed_in_the_evaluators_order_to_the_bit():
    """sqrt(var / n), not sd / sqrt(n): for 1, .5, .5, .75, .5 the first is exactly 0.1 and the second
    0.09999999999999999, and results.json's recorded standard errors are the first."""
    s = stat([1.0, 0.5, 0.5, 0.75, 0.5])
    assert s["se"] == 0.1
    assert s["sd"] / math.sqrt(5) != 0.1  # the other order would differ in the last bit


def test_the_n_equals_one_rule():
    # ddof 1: one value has no spread; a cell says n/a, an evaluation's record writes 0.0 (as recorded before)
    assert stat([0.7]) == {"mean": 0.7, "sd": None, "se": None, "n": 1, "values": [0.7]}
    assert cell(stat([0.7]), 2) == "0.70 ± n/a" and cell(stat([0.7]), bare=True) == "0.7"
    assert mean_and_se([0.7]) == (0.7, 0.0)
    # ddof 0 has a spread for one value: 0
    assert stat([1.0], ddof=0)["se"] == 0.0 and stat([0.7], ddof=0)["se"] == 0.0
    # no values: no mean; "-"
    assert stat([]) == EMPTY and cell(stat([])) == "-" and cell(None) == "-"
    with pytest.raises(ValueError, match="no tasks"):
        mean_and_se([])


def test_cell_text():
    s = stat([60.0, 62.0, 64.0])  # mean 62, sd 2, se 2 / sqrt(3) = 1.1547
    assert cell(s) == "62.0 ± 1.2" and cell(s, spread="sd") == "62.0 ± 2.0"
    # -.5, -.25: mean -.375, se sqrt(.03125 / 2) = .125; both exact in binary, rounded half to even
    assert cell(s, 0, sign=True) == "+62 ± 1" and cell(stat([-0.5, -0.25]), 2, sign=True) == "-0.38 ± 0.12"
    assert cell(stat([0.25, 0.75]), 0, scale=100) == "50 ± 25"  # mean .5, se sqrt(.125 / 2) = .25, in percent
    with pytest.raises(ValueError, match="spread"):
        cell(s, spread="ci")


def test_group_by_in_first_seen_order_and_one_stat_per_group():
    rows = [{"seed": 0, "policy": "rl", "field": "acc", "value": 60.0},
            {"seed": 0, "policy": "sft", "field": "acc", "value": 50.0},
            {"seed": 1, "policy": "rl", "field": "acc", "value": 64.0},
            {"seed": 1, "policy": "sft", "field": "turns", "value": 3.0}]
    g = group(rows, ("policy", "field"))
    assert list(g) == [("rl", "acc"), ("sft", "acc"), ("sft", "turns")]  # first-seen, not sorted
    assert g["rl", "acc"] == [rows[0], rows[2]]
    s = group_stats(rows, ("policy", "field"))
    # rl acc 60, 64: mean 62, sd sqrt(8), se sqrt(8 / 2) = 2; one value: no spread
    assert s["rl", "acc"] == {"mean": 62.0, "sd": math.sqrt(8), "se": 2.0, "n": 2, "values": [60.0, 64.0]}
    assert s["sft", "turns"] == stat([3.0])
    assert group_stats(rows, ("field",), ddof=0)["turns",]["se"] == 0.0
    assert nest(s)["sft"]["acc"]["values"] == [50.0] and list(nest(s)) == ["rl", "sft"]
    assert group([], ("x",)) == {} and nest({}) == {}
    with pytest.raises(ValueError, match="row 1 has no column 'policy'"):
        group([{"policy": "a"}, {"field": "b"}], ("policy",))
