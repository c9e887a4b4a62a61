"""What one RL step logs, gathered around the step rather than written into it.

- `StageTimer`: `with timer("rollout"): ...` times a stage of `Trainer.train_step` (rollout, update, and
  within the update old_logprobs); each becomes `time/<stage>_s`, and `time/step_s` is rollout + update.
- `rollout_metrics`: reward/*, rollout/*, traj/*, format/*, judge/* of a step's rollout.
- `combine_step_metrics`: one RL step's train/* and mismatch/* from its optimizer steps' metrics.
- `StepMetrics`: the step's metrics from the pieces above plus throughput (perf/*) and the engine's idle
  share, as `Trainer.train_step` returns them (finite floats only).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memrl.engines.base import capabilities
from memrl.training.step.rollout import RolloutResult
from memrl.types import Group
from memrl.workflows import format_counts, format_keys

COUNTED = ("train/rows", "train/tokens", "train/micro_batches", "train/rows_zero_adv_skipped", "train/forwarded_tokens")
"""Per-step metrics that count things: summed over an RL step's optimizer steps (the rest are averaged)."""

MISMATCH_TOKENS = "/tokens"

ROLLOUT_METRICS = ("answer_seen", "answer_kept", "memory_tokens_mean")
"""Trajectory metrics logged as rollout/<key> (MemAgent's names since the start); every other numeric
trajectory metric is logged as traj/<key>."""


class StageTimer:
    """Wall seconds per named stage of one step: `with timer("update"): ...`; `reset()` starts a step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def reset(self) -> None:
        self.seconds = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0


def _is_mismatch_mean(key: str) -> bool:
    return key.startswith("mismatch/") and not key.endswith(MISMATCH_TOKENS)


def _mismatch_tokens(key: str) -> str:
    return key.rsplit("/", 1)[0] + MISMATCH_TOKENS


def combine_step_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """One RL step's metrics from its optimizer steps' (memrl.training.step.schedule): counts summed, train/lr
    the last step's, the mismatch/<engine>/* token means weighed by their steps' mismatch/<engine>/tokens
    (summed), everything else the mean over the steps taken; train/optimizer_steps counts them."""
    out: dict[str, float] = {}
    for m in steps:
        for k, v in m.items():
            # mismatch/<engine>/<metric>: token means, re-weighed by each step's mismatch tokens
            out[k] = out.get(k, 0.0) + (v * m[_mismatch_tokens(k)] if _is_mismatch_mean(k) else v)
    for k in out:
        if k == "train/lr":
            out[k] = steps[-1][k]
        elif _is_mismatch_mean(k):
            out[k] /= sum(m.get(_mismatch_tokens(k), 0.0) for m in steps)
        elif k not in COUNTED and not k.endswith(MISMATCH_TOKENS):
            out[k] /= sum(1 for m in steps if k in m)
    if steps:
        out["train/optimizer_steps"] = float(len(steps))
    return out


def stats(prefix: str, xs: list[float]) -> dict[str, float]:
    """<prefix>/mean, std (population), max, min of `xs` ({} for none)."""
    if not xs:
        return {}
    return {f"{prefix}/mean": statistics.fmean(xs), f"{prefix}/std": statistics.pstdev(xs),
            f"{prefix}/max": max(xs), f"{prefix}/min": min(xs)}


def advantage_metrics(groups: list[Group]) -> dict[str, float]:
    """advantage/* over every segment of the kept groups (None counts as 0)."""
    return stats("advantage", [s.advantage or 0.0 for g in groups for t in g.trajectories for s in t.segments])


def rollout_metrics(res: RolloutResult) -> dict[str, float]:
    """The metrics of a step's rollout: reward/* over every sampled trajectory, group counts, and the
    workflow's own trajectory metrics over the kept ones: format/<key> (trajectories with that format
    error), judge/<kind> (MemAct's LLM judge: trajectories per verdict / failure / exclusion), and the
    mean of every other numeric trajectory metric some trajectory of the step reports (over those that
    report it): rollout/<key> for ROLLOUT_METRICS, traj/<key> for the rest. A workflow logs only the
    metrics it has (a MemAct run has no rollout/memory_tokens_mean)."""
    metrics: dict[str, float] = {}
    trajs = [t for g in res.groups for t in g.trajectories]
    metrics.update(stats("reward", res.all_rewards))
    metrics["reward/accuracy"] = statistics.fmean([float(r > 0) for r in res.all_rewards]) if res.all_rewards else 0.0
    metrics["rollout/groups_sampled"] = res.sampled_groups
    metrics["rollout/groups_dropped"] = res.dropped_groups
    metrics["rollout/groups_kept"] = len(res.groups)
    names = sorted({k for t in trajs for k, v in t.metrics.items() if isinstance(v, int | float)})
    counted = set(format_keys())  # logged as format/<key> below
    for name in names:
        if name in counted or name.startswith("judge_"):
            continue
        vals = [float(t.metrics[name]) for t in trajs if name in t.metrics]
        metrics[f"{'rollout' if name in ROLLOUT_METRICS else 'traj'}/{name}"] = statistics.fmean(vals)
    metrics.update({f"format/{k}": v for k, v in format_counts([t.metrics for t in trajs]).items()})
    for name in sorted({k for t in trajs for k in t.metrics if k.startswith("judge_")}):
        metrics[f"judge/{name[len('judge_'):]}"] = sum(float(t.metrics.get(name, 0.0)) for t in trajs)
    metrics["rollout/generated_tokens"] = sum(len(s.response_ids) for t in trajs for s in t.segments)
    metrics["rollout/segments"] = sum(len(t.segments) for t in trajs)
    return metrics


class EngineBusy:
    """perf/engine_idle_share: the share of the time since the last step's end in which the engine(s)
    generated nothing (engines that count their busy seconds: hf in process and in Ray replicas)."""

    def __init__(self, engine: Any) -> None:
        self.busy_of = engine.busy_seconds if capabilities(engine).busy_accounting else None
        self.last: tuple[float, float] | None = None  # (wall, engine busy seconds) at the last step's end

    def __call__(self) -> dict[str, float]:
        if self.busy_of is None:
            return {}
        now = time.perf_counter()
        busy, replicas = self.busy_of()
        if busy < 0:  # replicas that do not count their busy time (vLLM)
            return {}
        last, self.last = self.last, (now, busy)
        if last is None:
            return {}
        wall = max(now - last[0], 1e-9) * max(replicas, 1)
        return {"perf/engine_busy_s": busy - last[1], "perf/engine_idle_share": max(0.0, 1 - (busy - last[1]) / wall)}


def step_metrics(parts: list[dict[str, float]], res: RolloutResult, timer: StageTimer, asynchronous: bool,
                 busy: dict[str, float], position: int) -> dict[str, float]:
    """One step's logged metrics: the stages' own metric dicts (`parts`, in order), the stage times
    (time/rollout_s: asynchronous, the wait for the producer's batch; time/update_s: everything after it;
    time/step_s), throughput and the trainer's idle share, the engine's busy time, the data position.
    Non-finite and None values are left out."""
    metrics: dict[str, float] = {}
    for p in parts:
        metrics.update(p)
    rollout_s, update_s = timer.seconds.get("rollout", 0.0), timer.seconds.get("update", 0.0)
    metrics["time/rollout_s"] = rollout_s
    metrics["time/update_s"] = update_s
    metrics["time/step_s"] = rollout_s + update_s
    for stage, secs in timer.seconds.items():  # stages inside these two (time/old_logprobs_s)
        if stage not in ("rollout", "update"):
            metrics[f"time/{stage}_s"] = secs
    gen = metrics.get("rollout/generated_tokens", 0.0)
    metrics["perf/rollout_tokens_per_s"] = gen / max(res.seconds if asynchronous else rollout_s, 1e-9)
    metrics["perf/train_tokens_per_s"] = metrics.get("train/tokens", 0.0) / max(update_s, 1e-9)
    # trainer.prefix_sharing: tokens the update forwarded / its rows' tokens (1 without sharing)
    rows_tok = metrics.get("train/tokens", 0.0)
    metrics["perf/shared_token_ratio"] = metrics.get("train/forwarded_tokens", rows_tok) / rows_tok if rows_tok else 1.0
    metrics["perf/trainer_idle_share"] = rollout_s / max(rollout_s + update_s, 1e-9)
    metrics.update(busy)
    metrics["data/position"] = position
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
