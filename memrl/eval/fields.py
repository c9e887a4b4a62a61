"""Fields: what a table shows of a group of evaluation rows, declared once per method.

A recipe method (memrl.recipes.pipeline.Recipe) declares `fields: tuple[Field, ...]`. A `Field` is a name and a
reducer over ONE group's rows (memrl.eval.evaluator.evaluation_rows: task_id, sample, policy, decoding, bucket,
seed, heldout_sha256, the workflow's columns, reward, metrics). `summary_rows` groups every evaluation row of a
run by (policy, decoding, bucket), in first-seen order, and reduces each group with the fields: one summary
row {"policy", "decoding", "bucket", <field name>: value, ...} per group (the bucket as text: "2", "all"), plus,
with `pooled`, an "all" row per (policy, decoding) over all its buckets' rows, right after its last bucket.
That list is results.json's "summary" (memrl.recipes.pipeline) and the input of every table
(memrl.recipes.tables) and of the seed sweep (memrl.recipes.seeds).

The reducers every method needs (each returns a reducer: rows -> value; the arithmetic is
memrl.eval.evaluator's, so a summary keeps every bit of what the evaluator computes):

- `accuracy(ddof, value)`, `accuracy_se(ddof, value)`: mean +- SE over tasks of each task's mean `value` (the
  reward by default), in %; ddof 1: the sample standard deviation, ddof 0: the binomial sqrt(p (1 - p) / n).
- `mean(metric, scale)`: the mean of a trajectory metric over the rows (0 where a row lacks it), times `scale`
  (100 for a 0/1 metric shown in %); `maximum(metric)`: its largest value.
- `ratio(num, den)`: sum of metric `num` / sum of metric `den` over the rows (None when the sum of `den` is 0).
- `mean_where(metric, k, scale)`: the mean reward of the rows whose metric equals k, times `scale` (None when
  no row has k; e.g. MemAct's accuracy by question count).
- `tasks(cast)`: the number of tasks; `samples()`: rows per task (fails unless every task has as many).
- `per_task_means(value)`: each task's mean `value`, in first-row order (a paired gain's input,
  memrl.eval.evaluator.paired_gain).
- `share(test, scale)`: the share of rows where `test(row)` holds, times `scale`.
- `mean_of(test, metric)`: the mean of a metric over the rows where `test(row)` holds (0.0 when none does).

A method writes its own reducer as any function of the group's rows. Nothing here names a workflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memrl.eval.evaluator import accuracy as _accuracy
from memrl.eval.evaluator import by_task, per_task, reward_of, row_mean

Row = Mapping[str, Any]
Reducer = Callable[[Sequence[Row]], Any]

KEYS = ("policy", "decoding", "bucket")
"""The columns a summary row is grouped by (and the first three keys of every summary row)."""
POOLED = "all"
"""The bucket of a pooled summary row (every bucket of one policy and decoding)."""


@dataclass(frozen=True)
class Field:
    """A summary field: its name (the summary row's key, a table column's) and its reducer over one group's rows."""

    name: str
    reduce: Reducer


def summary_rows(rows: Sequence[Row], fields: Sequence[Field], pooled: bool = False) -> list[dict[str, Any]]:
    """The summary rows of `rows` (module docstring): one per (policy, decoding, bucket) in first-seen order,
    each {"policy", "decoding", "bucket" (str), <field>: its reducer's value}; with `pooled`, a (policy,
    decoding, "all") row over all its rows after the last bucket row of each (policy, decoding) (unless its
    rows are already bucketed "all")."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for i, r in enumerate(rows):
        try:
            key = (str(r["policy"]), str(r["decoding"]), str(r["bucket"]))
        except KeyError as e:
            raise ValueError(f"summary_rows: row {i} has no column {e.args[0]!r}") from None
        groups.setdefault(key, []).append(r)
    keys = list(groups)
    if pooled:
        pairs: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        for k in keys:
            pairs.setdefault(k[:2], []).append(k)
        for (p, d), ks in pairs.items():
            if (p, d, POOLED) not in groups:
                # one task per (bucket, task id): two buckets' task ids may coincide
                groups[(p, d, POOLED)] = [{**r, "task_id": (k[2], r["task_id"])} for k in ks for r in groups[k]]
                keys.insert(keys.index(ks[-1]) + 1, (p, d, POOLED))
    return [{"policy": p, "decoding": d, "bucket": b, **{f.name: f.reduce(groups[(p, d, b)]) for f in fields}}
            for p, d, b in keys]


def select(summary: Sequence[Mapping[str, Any]], **where: Any) -> list[Mapping[str, Any]]:
    """The summary rows whose columns equal `where` (e.g. policy="sft", decoding="greedy"), in their order."""
    return [s for s in summary if all(s.get(k) == v for k, v in where.items())]


def one(summary: Sequence[Mapping[str, Any]], **where: Any) -> Mapping[str, Any] | None:
    """The one summary row whose columns equal `where` (None when none does)."""
    hit = select(summary, **where)
    return hit[0] if hit else None


# ---------------------------------------------------------------------------------------------- reducers


def accuracy(ddof: int = 1, value: Callable[[Row], float] = reward_of) -> Reducer:
    """Accuracy in %: the mean over tasks of each task's mean `value` (memrl.eval.evaluator.accuracy)."""
    return lambda rows: _accuracy(rows, ddof, value)[0]


def accuracy_se(ddof: int = 1, value: Callable[[Row], float] = reward_of) -> Reducer:
    """The accuracy's standard error over tasks in % (0.0 for one task; ddof 0: binomial)."""
    return lambda rows: _accuracy(rows, ddof, value)[1]


def mean(metric: str, scale: float = 1.0) -> Reducer:
    """`scale` x the mean of a trajectory metric over the rows (memrl.eval.evaluator.row_mean)."""
    if scale == 1.0:
        return lambda rows: row_mean(rows, metric)
    return lambda rows: scale * row_mean(rows, metric)


def maximum(metric: str) -> Reducer:
    """The largest value of a trajectory metric over the rows (as a float)."""
    return lambda rows: float(max(r["metrics"][metric] for r in rows))


def ratio(num: str, den: str) -> Reducer:
    """sum(metric `num`) / sum(metric `den`) over the rows; None when the denominator sums to 0."""

    def reduce(rows: Sequence[Row]) -> float | None:
        d = sum(r["metrics"].get(den, 0) for r in rows)
        return sum(r["metrics"].get(num, 0) for r in rows) / d if d else None

    return reduce


def mean_where(metric: str, k: float, scale: float = 100.0) -> Reducer:
    """`scale` x the mean reward of the rows whose metric (0 where absent) equals `k`; None when no row does."""

    def reduce(rows: Sequence[Row]) -> float | None:
        sub = [float(r["reward"]) for r in rows if int(r["metrics"].get(metric, 0)) == k]
        return scale * (math.fsum(sub) / len(sub)) if sub else None

    return reduce


def tasks(cast: Callable[[int], Any] = int) -> Reducer:
    """The number of tasks of the rows (distinct task ids), through `cast` (int, or float)."""
    return lambda rows: cast(len(by_task(rows)))


def samples() -> Reducer:
    """Rows per task; fails unless every task has as many (one evaluation's rows)."""

    def reduce(rows: Sequence[Row]) -> int:
        counts = {len(v) for v in by_task(rows).values()}
        if len(counts) != 1:
            raise ValueError(f"samples: tasks have {sorted(counts)} rows each; one evaluation's rows needed")
        return counts.pop()

    return reduce


def per_task_means(value: Callable[[Row], float] = reward_of) -> Reducer:
    """Each task's mean `value` over its rows, tasks in first-row order (a list)."""
    return lambda rows: per_task(rows, value)


def share(test: Callable[[Row], bool], scale: float = 100.0) -> Reducer:
    """`scale` x the share of rows where `test(row)` holds."""
    return lambda rows: scale * sum(1 for r in rows if test(r)) / len(rows)


def mean_of(test: Callable[[Row], bool], metric: str) -> Reducer:
    """The mean of a trajectory metric over the rows where `test(row)` holds; 0.0 when none does."""

    def reduce(rows: Sequence[Row]) -> float:
        sub = [r for r in rows if test(r)]
        return row_mean(sub, metric) if sub else 0.0

    return reduce
