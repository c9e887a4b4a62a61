"""memrl.eval.fields: the summary of a run's evaluation rows, one row per (policy, decoding, bucket) reduced by a
method's fields, and the reducers, checked by hand."""

from __future__ import annotations

import math

import pytest

from memrl.eval import fields as F
from memrl.eval.fields import Field, summary_rows


def row(task: str, reward: float, policy: str = "sft", decoding: str = "greedy", bucket: object = 2,
        sample: int = 0, **metrics: float) -> dict:
    return {"task_id": task, "sample": sample, "policy": policy, "decoding": decoding, "bucket": bucket,
            "reward": reward, "metrics": metrics}


def test_summarize_groups_in_first_seen_order_and_pools_per_bucket_tasks():
    rows = [row("a", 1.0, bucket=2, q=2), row("b", 0.0, bucket=2, q=3), row("a", 1.0, decoding="sampled", bucket=2),
            row("a", 0.0, bucket=4, q=2), row("b", 0.0, bucket=4, q=2), row("c", 1.0, policy="rl", bucket=2)]
    fs = (Field("accuracy", F.accuracy()), Field("tasks", F.tasks()), Field("q2", F.mean_where("q", 2)))
    got = summary_rows(rows, fs, pooled=True)
    # each pooled row right after the last bucket of its policy and decoding
    assert [(s["policy"], s["decoding"], s["bucket"]) for s in got] == [
        ("sft", "greedy", "2"), ("sft", "sampled", "2"), ("sft", "sampled", "all"), ("sft", "greedy", "4"),
        ("sft", "greedy", "all"), ("rl", "greedy", "2"), ("rl", "greedy", "all")]
    by = {(s["policy"], s["decoding"], s["bucket"]): s for s in got}
    assert by["sft", "greedy", "2"] == {"policy": "sft", "decoding": "greedy", "bucket": "2", "accuracy": 50.0,
                                        "tasks": 2, "q2": 100.0}
    assert by["sft", "greedy", "4"]["q2"] == 0.0 and by["sft", "sampled", "2"]["q2"] is None  # no row with q = 2
    # pooled: task "a" of length 2 and task "a" of length 4 are two tasks (1, 0, 0, 0 -> 25%, 4 tasks)
    assert (by["sft", "greedy", "all"]["accuracy"], by["sft", "greedy", "all"]["tasks"]) == (25.0, 4)
    with pytest.raises(ValueError, match=r"^summary_rows: row 1 has no column 'bucket'$"):
        summary_rows([row("a", 1.0), {"policy": "sft", "decoding": "greedy"}], fs)


def test_reducers_by_hand():
    # 3 tasks, 2 samples each: task means 1, 0.5, 0 -> 50% +- sd 0.5 / sqrt(3)
    rows = [row(t, r, sample=k, steps=s, hits=h, flag=f) for t, rs in (("a", (1, 1)), ("b", (1, 0)), ("c", (0, 0)))
            for k, (r, s, h, f) in enumerate(zip(rs, (2, 4), (1, 0), (1, 0), strict=True))]
    assert F.accuracy()(rows) == 50.0 and F.accuracy_se()(rows) == pytest.approx(100 * 0.5 / math.sqrt(3))
    assert F.per_task_means()(rows) == [1.0, 0.5, 0.0] and F.samples()(rows) == 2 and F.tasks(float)(rows) == 3.0
    assert F.mean("steps")(rows) == 3.0 and F.mean("flag", 100.0)(rows) == 50.0 and F.maximum("steps")(rows) == 4.0
    assert F.ratio("hits", "steps")(rows) == 3 / 18 and F.ratio("hits", "missing")(rows) is None
    assert F.share(lambda r: r["reward"] > 0)(rows) == 50.0
    assert F.mean_of(lambda r: r["metrics"]["flag"], "steps")(rows) == 2.0
    assert F.mean_of(lambda r: False, "steps")(rows) == 0.0
    # one 0/1 sample per task, ddof 0: the binomial sqrt(p (1 - p) / n) = sqrt(0.25 / 4)
    one = [row(t, r) for t, r in zip("abcd", (1, 0, 1, 0), strict=True)]
    assert F.accuracy_se(0)(one) == 25.0 and F.accuracy(0, lambda r: 1 - r["reward"])(one) == 50.0
    with pytest.raises(ValueError, match=r"tasks have \[1, 2\] rows each"):
        F.samples()(rows[:3])
