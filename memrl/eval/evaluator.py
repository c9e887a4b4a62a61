"""The one evaluator: `memrl eval` (memrl.eval.runner), both demos and in-training validation score with
the code here, so a fix to a metric or a standard error is made once.

Three pieces:

- **the rollout**, injected as ONE callable (`Rollout`): `rollout(tasks, wf_cfg, n, seed) -> list[Group]`,
  scored groups in task order, trajectory k of a task seeded by
  `memrl.workflows.rollouts.trajectory_rng(seed, task_id, first_sample + k)`. `EngineRollout` is the default
  (today's `memrl.workflows.rollouts.rollout` over one engine); a run-scoped runtime can stand in for it.
- **statistics over tasks**: each task's mean score over its samples is one observation; the accuracy is
  their mean and its standard error `mean_and_se` (memrl.eval.stats.stat: std(task means, ddof 1) / sqrt(tasks); the k samples
  of one task share the task, so k x tasks observations would understate it). pass@k likewise over each
  task's best sample. `memrl.eval.report` (mean@k, pass@k of results.jsonl rows) calls the same functions.
- **one evaluation**: `evaluate_rows` (one task set, one decoding) makes one row per trajectory
  (`evaluation_rows`: the policy, decoding, bucket, seed and held-out digest columns beside the workflow's own,
  the reward and the metrics; written to a JSONL file with `rows_to`) and returns them. Every number is a
  reducer's over rows: `eval_record` (results.json's record of one evaluation: accuracy +- SE over tasks, the
  per-task means for paired comparisons, `paired_gain`, and the means of the trajectory metrics), `accuracy`,
  `per_task`, `pass_at_k`, `row_mean`, `group_rows` (by policy, decoding, bucket). The demos' summaries over
  rows are their methods' fields (memrl.eval.fields reducers, declared beside each method).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from memrl.engines import build_engine, engine_kind
from memrl.eval.stats import stat
from memrl.runtime import RolloutRuntime
from memrl.types import Group, Task, Trajectory
from memrl.workflows.rollouts import takes_services, trajectory_rng

# ---------------------------------------------------------------- statistics over tasks


def mean_and_se(per_task: Sequence[float], ddof: int = 1) -> tuple[float, float]:
    """(mean, standard error of the mean) of per-task values for an evaluation's record: memrl.eval.stats.stat's
    (ddof 1: the sample standard deviation, every evaluation here; ddof 0 over 0/1 values: the binomial
    sqrt(p (1 - p) / n), the MemAct demo's published table); the SE of one task is recorded as 0.0 (the stats
    module's n = 1 rule). Fails on no tasks."""
    if not per_task:
        raise ValueError("mean_and_se: no tasks")
    s = stat(per_task, ddof)
    return s["mean"], 0.0 if s["se"] is None else s["se"]


def task_means(scores_by_task: Iterable[Sequence[float]]) -> list[float]:
    """Each task's mean score over its samples (mean@k's per-task value)."""
    return [sum(v) / len(v) for v in scores_by_task]


def task_best(scores_by_task: Iterable[Sequence[float]]) -> list[float]:
    """Each task's best score over its samples (pass@k's per-task value)."""
    return [max(v) for v in scores_by_task]


def paired_gain(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """(mean gain, its standard error) in percent from two policies' per-task mean rewards on the SAME tasks:
    the SE of the per-task differences (paired), which removes the between-task variance both share."""
    if len(before) != len(after):
        raise ValueError(f"paired_gain: {len(before)} vs {len(after)} tasks; a paired gain needs the same tasks")
    mean, se = mean_and_se([b - a for a, b in zip(before, after, strict=True)])
    return 100.0 * mean, 100.0 * se


# ---------------------------------------------------------------- the rollout, injected


class Rollout(Protocol):
    """n scored trajectories per task, one Group per task in task order. Trajectory k of a task is sample
    `first_sample + k`, seeded trajectory_rng(seed, task_id, first_sample + k); `on_start(task)` runs when
    a trajectory starts, `on_done(task, trajectory)` when it is scored."""

    def __call__(self, tasks: Sequence[Task], wf_cfg: Any, n: int = 1, seed: int = 0, *, first_sample: int = 0,
                 on_start: Callable[[Task], None] | None = None,
                 on_done: Callable[[Task, Trajectory], None] | None = None) -> list[Group]: ...


@dataclass
class EngineRollout:
    """The default `Rollout`: `spec` sampled through `engine` on a memrl.runtime.RolloutRuntime, at most
    `concurrency` trajectories in flight, scored as each finishes. With `runtime` (one event loop and one
    client per service for a whole run) every call runs on its loop with its services; without, each call
    runs on a RolloutRuntime of its own over `engine` (not closing the engine), closed before it returns."""

    engine: Any
    spec: Any
    concurrency: int = 4096
    runtime: Any = None

    @property
    def tokenizer(self) -> Any:
        return getattr(self.engine, "tokenizer", None)

    def __call__(self, tasks: Sequence[Task], wf_cfg: Any, n: int = 1, seed: int = 0, *, first_sample: int = 0,
                 on_start: Callable[[Task], None] | None = None,
                 on_done: Callable[[Task, Trajectory], None] | None = None) -> list[Group]:
        if first_sample and n != 1:
            raise ValueError(f"EngineRollout: first_sample={first_sample} needs n=1, got n={n}")
        spec = self.spec
        if first_sample or on_start is not None:
            base, base_takes = spec.run, takes_services(spec.run)

            async def run(task: Task, engine: Any, cfg: Any, rng: Any, services: Any = None) -> Trajectory:
                if on_start is not None:
                    on_start(task)
                if first_sample:  # the rollout's own rng is sample 0's
                    rng = trajectory_rng(seed, task.task_id, first_sample)
                if base_takes:
                    return await base(task, engine, cfg, rng, services=services)
                return await base(task, engine, cfg, rng)

            spec = replace(spec, run=run)
        runtime = self.runtime or RolloutRuntime(self.engine, concurrency=self.concurrency, close_engine=False)
        try:
            return runtime.run(runtime.asample(list(tasks), n, seed, cfg=wf_cfg, spec=spec, on_done=on_done,
                                               engine=self.engine, score=True, concurrency=self.concurrency))
        finally:
            if runtime is not self.runtime:
                runtime.close()


@contextmanager
def model_engine(model: Any, tokenizer: Any, engine_cfg: Any, model_dir: str | Path = "") -> Iterator[Any]:
    """The engine `engine_cfg` (an EngineConfig: the caller's `engine` section, e.g. the demo's train
    config's) names serving `model`; an engine that loads weights itself (vllm) loads `model_dir`, which
    must hold `model`'s weights. Closed on exit."""
    ecfg = engine_cfg
    if not engine_kind(ecfg.name).serves_policy and not ecfg.model:
        ecfg = replace(ecfg, model=str(model_dir))
    engine = build_engine(ecfg, policy=model, tokenizer=tokenizer)
    runtime = RolloutRuntime(engine)  # closes the engine on its loop
    try:
        yield engine
    finally:
        runtime.close()


# ---------------------------------------------------------------- the evaluation row


PERCENT = ("no_box", "answer_seen", "answer_kept")
"""Trajectory metrics that are 0/1 per trajectory, reported in percent."""
DEFAULT_METRICS = ("context_tokens", *PERCENT)
"""The MemAgent workflow's trajectory metrics an evaluation's record (`eval_record`) reports by default."""

ROW_COLUMNS = ("policy", "decoding", "bucket", "seed", "heldout_sha256")
"""The columns every evaluation row carries beside its trajectory's own: the policy evaluated (a recipe's stage:
demonstrator, sft, rl, ...), the decoding (greedy or sampled), the task bucket (a length or document count;
"all" where the evaluation has one bucket, MemAct's and the context family's: the tables' name of it),
the sampling seed and the SHA-256 of the held-out tasks ("" where the caller has none)."""


def decoding_of(temperature: float) -> str:
    """An evaluation's decoding column: greedy at temperature 0, sampled otherwise."""
    return "greedy" if temperature == 0 else "sampled"


def row_labels(policy: str, temperature: float, bucket: Any, seed: int, heldout_sha256: str) -> dict[str, Any]:
    """An evaluation row's ROW_COLUMNS (`memrl eval`'s rows: memrl.eval.results_file.result_row, too)."""
    return {"policy": policy, "decoding": decoding_of(temperature), "bucket": bucket, "seed": seed,
            "heldout_sha256": heldout_sha256}


def evaluation_rows(groups: Sequence[Group], seed: int = 0, temperature: float = 0.0, bucket: Any = None,
                    policy: str = "", heldout_sha256: str = "",
                    row_columns: Callable[[Trajectory], Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per scored trajectory, in task then sample order: task_id, sample, the ROW_COLUMNS, the
    workflow's own columns (`row_columns`: WorkflowSpec.row_columns, as `memrl eval`'s rows), the reward and
    the trajectory's metrics. Every evaluation's numbers are computed from these (the reducers below), and so
    are a scripted agent's (its played groups' rows)."""
    labels = row_labels(policy, temperature, bucket, seed, heldout_sha256)
    rows = []
    for g in groups:
        for k, (t, reward) in enumerate(zip(g.trajectories, g.rewards, strict=True)):
            own = dict(row_columns(t)) if row_columns is not None else {}
            rows.append({"task_id": g.task_id, "sample": k, **labels, **own, "reward": reward,
                         "metrics": {name: float(v) for name, v in t.metrics.items()}})
    return rows


# ---------------------------------------------------------------- one evaluation


def evaluate_rows(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], samples: int = 1, temperature: float = 0.0,
                  seed: int = 0, *, bucket: Any = None, policy: str = "", heldout_sha256: str = "",
                  on_trajectory: Callable[[Task, Trajectory], None] | None = None,
                  rows_to: str | Path | None = None) -> list[dict[str, Any]]:
    """THE evaluation: `samples` trajectories per task through `rollout` at `temperature` (0 = greedy, one per
    task; the workflow config's `temperature` is replaced), seeded with `seed`; their rows (`evaluation_rows`,
    labelled with `bucket`, `policy` and `heldout_sha256`, with the rollout's workflow columns). `on_trajectory`
    sees every finished trajectory; with `rows_to` the rows are appended to that JSONL file. The numbers are the
    reducers' over the rows (`eval_record`: results.json's record); a caller that records time times the call."""
    if samples < 1:
        raise ValueError(f"evaluate_rows: samples must be >= 1, got {samples}")
    if temperature == 0 and samples != 1:
        raise ValueError("evaluate_rows: greedy decoding (temperature 0) gives one trajectory per task; samples must be 1")
    groups = rollout(list(tasks), replace(wf_cfg, temperature=temperature), samples, seed, on_done=on_trajectory)
    rows = evaluation_rows(groups, seed, temperature, bucket, policy, heldout_sha256,
                           getattr(getattr(rollout, "spec", None), "row_columns", None))
    if rows_to is not None:
        append_rows(rows_to, rows)
    return rows


# ---------------------------------------------------------------- reducers over rows


def reward_of(row: Mapping[str, Any]) -> float:
    """A row's reward (the reducers' default value)."""
    return row["reward"]


def by_task(rows: Iterable[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float] = reward_of,
            samples: int | None = None) -> dict[str, list[float]]:
    """{task_id: `value` of each of its rows}, tasks in first-row order. With `samples`, fails unless every task
    has that many rows (one evaluation's rows: one policy, decoding and bucket)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["task_id"], []).append(value(r))
    if samples is not None and (bad := [t for t, v in out.items() if len(v) != samples]):
        raise ValueError(f"rows: task {bad[0]} has {len(out[bad[0]])} rows, not {samples} "
                         "(one evaluation's rows, one task id per task)")
    return out


def per_task(rows: Iterable[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float] = reward_of,
             samples: int | None = None) -> list[float]:
    """Each task's mean `value` over its rows (mean@k's per-task value), tasks in first-row order."""
    return task_means(by_task(rows, value, samples).values())


def accuracy(rows: Iterable[Mapping[str, Any]], ddof: int = 1,
             value: Callable[[Mapping[str, Any]], float] = reward_of) -> tuple[float, float]:
    """(accuracy, its standard error) in percent: mean +- SE over tasks of each task's mean `value`
    (`mean_and_se`; ddof 1, or 0: the binomial SE)."""
    mean, se = mean_and_se(per_task(rows, value), ddof)
    return 100.0 * mean, 100.0 * se


def pass_at_k(rows: Iterable[Mapping[str, Any]], ddof: int = 1) -> tuple[float, float]:
    """(pass@k, its standard error) in percent: mean +- SE over tasks of each task's best reward."""
    mean, se = mean_and_se(task_best(by_task(rows).values()), ddof)
    return 100.0 * mean, 100.0 * se


def row_mean(rows: Sequence[Mapping[str, Any]], name: str) -> float:
    """Mean of one trajectory metric over the rows (0 where a row lacks it), summed exactly (math.fsum)."""
    return math.fsum(r["metrics"].get(name, 0.0) for r in rows) / len(rows)


def group_rows(rows: Iterable[Mapping[str, Any]],
               by: Sequence[str] = ("policy", "decoding", "bucket")) -> dict[tuple[Any, ...], list[Mapping[str, Any]]]:
    """The rows grouped by the values of the columns `by`, groups in first-seen order, rows in their order."""
    out: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(tuple(r[c] for c in by), []).append(r)
    return out


def eval_record(rows: Sequence[Mapping[str, Any]], samples: int, temperature: float, seconds: float = 0.0,
                metrics: Sequence[str] = DEFAULT_METRICS, se_ddof: int = 1) -> dict[str, Any]:
    """What results.json records for one evaluation (one policy, decoding and bucket) from its rows: accuracy
    (mean reward over tasks x samples, %) and its SE over tasks (of each task's mean reward, %; 0.0 for one
    task), num_tasks, samples, temperature, the means of the named trajectory metrics over all rows (percent
    for those in PERCENT), seconds, and per_task: each task's mean reward (0..1) in first-row order, for
    paired comparisons (`paired_gain`). Fails unless every task has `samples` rows."""
    means = per_task(rows, samples=samples)
    acc, se = mean_and_se(means, se_ddof)
    return {"accuracy": 100.0 * acc, "se": 100.0 * se, "num_tasks": len(means), "samples": samples,
            "temperature": temperature,
            "metrics": {m: 100.0 * row_mean(rows, m) if m in PERCENT else row_mean(rows, m) for m in metrics},
            "seconds": seconds, "per_task": means}


def tasks_sha256(tasks: Iterable[Task]) -> str:
    """The held-out digest of tasks held in memory: the SHA-256 of their id, question, context and answers as
    JSON lines, in order (a row's `heldout_sha256` where no held-out file is written)."""
    digest = hashlib.sha256()
    for t in tasks:
        line = json.dumps([t.task_id, t.question, t.context, t.answers], ensure_ascii=False)
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


def append_rows(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append evaluation rows to the JSONL file `path` (created with its folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
