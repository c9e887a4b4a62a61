"""The one statistic and the one table cell of the package and the benchmarks.

`stat(values, ddof=1)` is a mean with its spread: {"mean", "sd", "se", "n", "values"} (a plain dict, so a sweep's
aggregate is JSON as it is). sd = sqrt(sum of squared deviations / (n - ddof)), se = sqrt(that / n) (computed in
that order, the evaluator's arithmetic, so results.json's numbers keep every bit); ddof 1: the sample standard
deviation (every evaluation and every table over seeds), ddof 0 over 0/1 values: the binomial sqrt(p (1 - p) / n)
in that closed form (the MemAct demo's published table).

The n = 1 rule: a spread needs more values than `ddof`. With ddof 1, one value has no spread: sd and se are None,
and `cell` writes "n/a" for it (a sweep over one seed: "62.0 ± n/a"). No values: mean None too, and `cell`
writes "-". An evaluation's record (memrl.eval.evaluator.mean_and_se: results.json's `se` / `accuracy_se`)
writes the SE of a one-task set as 0.0, as every recorded results.json has it.

`cell(s)` is the one text of such a statistic (or of one `recorded` as numbers) in a table: "mean ± se" (or ± sd, `spread="sd"`: the seed sweep's
tables), `digits` decimals, optionally signed and scaled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

Stat = dict[str, Any]
"""{"mean": float | None, "sd": float | None, "se": float | None, "n": int, "values": list[float]}."""

EMPTY: Stat = {"mean": None, "sd": None, "se": None, "n": 0, "values": []}
"""The statistic of no values (a cell no run has)."""


def stat(values: Iterable[float], ddof: int = 1) -> Stat:
    """Mean, standard deviation and standard error of the mean of `values` (see the module's n = 1 rule)."""
    vals = [float(v) for v in values]
    if ddof not in (0, 1):
        raise ValueError(f"stat: ddof must be 0 or 1, got {ddof}")
    n = len(vals)
    if n == 0:
        return {**EMPTY, "values": []}
    mean = sum(vals) / n
    sd = se = None
    if n > ddof:
        if ddof == 0 and all(x in (0.0, 1.0) for x in vals):  # 0/1 values: the binomial closed form
            sd, se = math.sqrt(mean * (1 - mean)), math.sqrt(mean * (1 - mean) / n)
        else:
            var = sum((x - mean) ** 2 for x in vals) / (n - ddof)
            sd, se = math.sqrt(var), math.sqrt(var / n)
    return {"mean": mean, "sd": sd, "se": se, "n": n, "values": vals}


def recorded(mean: float, se: float) -> Stat:
    """The statistic of a record that keeps only its numbers (results.json's accuracy and its SE, the paired
    gain's), for `cell`: {"mean", "se"}; sd and n unknown."""
    return {"mean": mean, "sd": None, "se": se, "n": None, "values": []}


def cell(s: Stat | None, digits: int = 1, sign: bool = False, scale: float = 1.0, spread: str = "se",
         bare: bool = False) -> str:
    """A table's text of `stat`'s `s`: "mean ± spread" (spread "se" or "sd"), both times `scale`, with `digits`
    decimals, the mean signed with `sign`; "mean ± n/a" without a spread (one value), or the mean alone with
    `bare`; "-" for no values (None or n = 0)."""
    if spread not in ("se", "sd"):
        raise ValueError(f"cell: spread must be 'se' or 'sd', got {spread!r}")
    if s is None or s["mean"] is None:
        return "-"
    m = f"{scale * s['mean']:+.{digits}f}" if sign else f"{scale * s['mean']:.{digits}f}"
    sp = s[spread]
    if sp is None:
        return m if bare else f"{m} ± n/a"
    return f"{m} ± {scale * sp:.{digits}f}"
