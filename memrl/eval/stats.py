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

`cell(s)` is the one text of such a statistic (or of one `recorded` as numbers) in a table: "mean ± se" (or ± sd,
`spread="sd"`: the seed sweep's tables), `digits` decimals, optionally signed and scaled.

The one aggregation: a table over seeds (or tasks) is long rows, one value each (e.g. {"run", "seed", "policy",
"decoding", "bucket", "field", "value"}), grouped by some of their columns (`group`, first-seen order) and each
group's values reduced with `stat` (`group_stats`); `nest` turns the tuple keys into nested dicts (a JSON
aggregate). Comparisons of two arms paired by seed: `paired` (its values, for `stat`) and `diff_se` (the SE of a
per-seed difference of two independent estimates, from their own SEs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
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


# ---------------------------------------------------------------------------------------------- the group-by

Row = Mapping[str, Any]
"""A long row: column -> value (e.g. {"seed": "seed0", "policy": "rl", "field": "accuracy", "value": 62.0})."""


def group(rows: Iterable[Row], by: Sequence[str]) -> dict[tuple[Any, ...], list[Row]]:
    """`rows` by their values of the columns `by` (the key: that tuple), groups and their rows in first-seen order.
    A row without one of the columns fails in one line naming it."""
    out: dict[tuple[Any, ...], list[Row]] = {}
    for i, row in enumerate(rows):
        try:
            key = tuple(row[c] for c in by)
        except KeyError as e:
            raise ValueError(f"group: row {i} has no column {e.args[0]!r} (it has {', '.join(row)})") from None
        out.setdefault(key, []).append(row)
    return out


def group_stats(rows: Iterable[Row], by: Sequence[str], value: str = "value", ddof: int = 1) -> dict[tuple[Any, ...], Stat]:
    """`stat` (with `ddof`) of each group's `value` column (`group`: keys and order)."""
    return {key: stat((r[value] for r in g), ddof) for key, g in group(rows, by).items()}


def nest(flat: Mapping[tuple[Any, ...], Any]) -> dict[Any, Any]:
    """{(a, b, c): v} -> {a: {b: {c: v}}}, in `flat`'s order (keys of one length)."""
    out: dict[Any, Any] = {}
    for key, v in flat.items():
        d = out
        for k in key[:-1]:
            d = d.setdefault(k, {})
        d[key[-1]] = v
    return out


def paired(a: Mapping[Any, Any], b: Mapping[Any, Any], value: Callable[[Any, Any], float]) -> list[float]:
    """A per-seed comparison of two arms: `value(a[k], b[k])` for each seed k both have (keys: the seeds), in a's
    order; `stat` of it is the paired difference's cell."""
    return [value(x, b[k]) for k, x in a.items() if k in b]


def diff_se(se_a: Sequence[float], se_b: Sequence[float]) -> float:
    """The standard error of the mean over n seeds of a per-seed difference a - b of two independent estimates,
    from each one's own standard error (e.g. over tasks): sqrt(sum over seeds of se_a^2 + se_b^2) / n."""
    return math.sqrt(math.fsum(a ** 2 + b ** 2 for a, b in zip(se_a, se_b, strict=True))) / len(se_a)
