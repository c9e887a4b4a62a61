"""Held-out evaluation of a policy (or a scripted demonstrator) over tasks of several lengths.

Generic over the workflow: anything `memrl.workflows.get_workflow` returns, with a config dataclass that
has a `temperature` field. Two modes per length:

- greedy: one trajectory per task at temperature 0;
- sampled: `samples` trajectories per task at `temperature`, seeded per (seed, task, sample) through the
  workflow's per-call seeds, so a rerun samples exactly the same trajectories.

Accuracy is the mean reward in percent. Its standard error is taken over TASKS: each task's mean reward
over its samples is one observation, SE = std(task means, ddof=1) / sqrt(tasks). The k samples of one task
are not independent draws of the benchmark (they share the task), so k * tasks would understate it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from memrl.types import Task, Trajectory


@dataclass
class EvalResult:
    """One policy, one length, one decoding mode."""

    accuracy: float
    """Mean reward over tasks x samples, in percent."""
    se: float
    """Standard error of `accuracy` over tasks (of each task's mean reward), in percent; 0 for one task."""
    num_tasks: int
    samples: int
    temperature: float
    metrics: dict[str, float] = field(default_factory=dict)
    """Means of trajectory metrics over all trajectories (percent for the 0/1 ones named in PERCENT)."""
    seconds: float = 0.0
    per_task: list[float] = field(default_factory=list)
    """Each task's mean reward (0..1), in task order: paired comparisons of two policies on the same tasks."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


PERCENT = ("no_box", "answer_seen", "answer_kept")
"""Trajectory metrics that are 0/1 per trajectory, reported in percent."""


def mean_and_se(per_task: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) of per-task values; SE = sample std (ddof 1) / sqrt(n)."""
    n = len(per_task)
    if n == 0:
        raise ValueError("mean_and_se: no tasks")
    mean = sum(per_task) / n
    if n == 1:
        return mean, 0.0
    var = sum((x - mean) ** 2 for x in per_task) / (n - 1)
    return mean, math.sqrt(var / n)


def evaluate_tasks(engine: Any, spec: Any, wf_cfg: Any, tasks: Sequence[Task], samples: int = 1,
                   temperature: float = 0.0, seed: int = 0, concurrency: int = 4096,
                   metrics: Sequence[str] = ("context_tokens", *PERCENT),
                   on_trajectory: Callable[[Task, Trajectory], None] | None = None) -> EvalResult:
    """Run `spec` over `tasks` x `samples` through `engine` at `temperature` (0 = greedy); the accuracy and
    its standard error over tasks, plus the mean of each named trajectory metric. `on_trajectory` sees every
    finished trajectory (viewers, tests)."""
    from memrl.workflows.runner import rollout_sync

    if samples < 1:
        raise ValueError(f"evaluate_tasks: samples must be >= 1, got {samples}")
    if temperature == 0 and samples != 1:
        raise ValueError("evaluate_tasks: greedy decoding (temperature 0) gives one trajectory per task; samples must be 1")
    t0 = time.perf_counter()
    cfg = replace(wf_cfg, temperature=temperature)
    groups = rollout_sync(list(tasks), spec, engine, cfg, n=samples, concurrency=concurrency, seed=seed,
                          on_done=on_trajectory)
    per_task = [sum(g.rewards) / len(g.rewards) for g in groups]
    acc, se = mean_and_se(per_task)
    trajs = [t for g in groups for t in g.trajectories]
    means = {}
    for name in metrics:
        m = sum(t.metrics.get(name, 0.0) for t in trajs) / len(trajs)
        means[name] = 100.0 * m if name in PERCENT else m
    return EvalResult(100.0 * acc, 100.0 * se, len(groups), samples, temperature, means, time.perf_counter() - t0,
                      per_task)


@dataclass
class EvalProtocol:
    """What every evaluated policy is run on (fixed before any run)."""

    greedy: bool = True
    samples: int = 4
    """Sampled trajectories per task (0 = no sampled evaluation)."""
    temperature: float = 1.0
    seed: int = 987654
    """Seeds the tasks' sampling (the task set itself is the caller's)."""


def paired_gain(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """(mean gain, its standard error) in percent from two policies' per-task mean rewards on the SAME tasks:
    the SE of the per-task differences (paired), which removes the between-task variance both share."""
    if len(before) != len(after):
        raise ValueError(f"paired_gain: {len(before)} vs {len(after)} tasks; a paired gain needs the same tasks")
    mean, se = mean_and_se([b - a for a, b in zip(before, after, strict=True)])
    return 100.0 * mean, 100.0 * se


def evaluate_policy(engine: Any, spec: Any, wf_cfg: Any, tasks_by_length: dict[int, list[Task]],
                    protocol: EvalProtocol, modes: Sequence[str] = ("greedy", "sampled"),
                    log: Any = None) -> dict[int, dict[str, EvalResult]]:
    """{length: {"greedy": ..., "sampled": ...}} for the modes the protocol enables (and `modes` asks for)."""
    out: dict[int, dict[str, EvalResult]] = {}
    for length, tasks in tasks_by_length.items():
        row: dict[str, EvalResult] = {}
        if protocol.greedy and "greedy" in modes:
            row["greedy"] = evaluate_tasks(engine, spec, wf_cfg, tasks, 1, 0.0, protocol.seed)
        if protocol.samples > 0 and "sampled" in modes:
            row["sampled"] = evaluate_tasks(engine, spec, wf_cfg, tasks, protocol.samples, protocol.temperature,
                                            protocol.seed)
        out[length] = row
        if log is not None:
            log(f"  {length}: " + ", ".join(f"{m} {r.accuracy:.1f} ± {r.se:.1f}% ({r.seconds:.0f}s)"
                                            for m, r in row.items()))
    return out


@contextmanager
def model_engine(model: Any, tokenizer: Any, engine_cfg: Any = None, model_dir: str | Path = "") -> Iterator[Any]:
    """The engine `engine_cfg` names serving `model` (default: the hf engine over `model` itself); an engine
    that loads weights itself (vllm) loads `model_dir`, which must hold `model`'s weights. Closed on exit."""
    from memrl.engines import EngineConfig, build_engine

    ecfg = engine_cfg if engine_cfg is not None else EngineConfig(max_batch_size=256)
    if ecfg.name != "hf" and not ecfg.model:
        ecfg = replace(ecfg, model=str(model_dir))
    engine = build_engine(ecfg, policy=model, tokenizer=tokenizer)
    try:
        yield engine
    finally:
        asyncio.run(engine.close())


def results_to_json(res: dict[int, dict[str, EvalResult]]) -> dict[str, dict[str, Any]]:
    """JSON form of `evaluate_policy`'s result: lengths become strings."""
    return {str(n): {m: r.to_json() for m, r in row.items()} for n, row in res.items()}
