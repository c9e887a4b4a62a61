"""Training health: what every RL step says about a collapse, and the alarms the guard acts on.

`step_health` reads one step's rollout (and the update's entropy) and returns the health/* metrics:

- health/format_failure_share: trajectories with at least one of the workflow's format errors
  (WorkflowSpec.format_keys: no box, malformed calls, no final marker, ...) over the step's trajectories;
- health/truncation_share: trajectories cut short (a call that ended at its token budget, finish "length",
  or a multi-turn run that stopped without an answer, info["overlong"]), over those that say either;
- health/zero_variance_share: sampled groups whose rewards all agree (dynamic sampling's dropped groups
  count: they were dropped for it);
- health/entropy: the policy's entropy on the trained tokens (the update's loss/entropy);
- health/right_logprob: the mean sampling log-probability of the generated tokens of the trajectories that
  were right (outcome > 0), and health/right_logprob_delta: it minus the mean of the previous
  `health.window` steps' values (LLDS, arXiv 2512.04220: the likelihood of correct responses falls before
  a GRPO collapse);
- health/reward_mean and health/reward_trend: the least-squares slope of reward/mean per step over the
  last `health.window` steps.

`HealthMonitor` keeps the few numbers those need across steps (saved in every checkpoint, so a resumed
run computes the same) and counts, per alarm, the consecutive steps its condition held:

- dead: every sampled group has zero reward variance, no reward is above `health.dead_reward`, and no row
  has a non-zero advantage (advantage/min and advantage/max 0: process rewards, FoldGRPO's token-level
  terms, still give the update a gradient when every outcome is 0, and that run is not dead);
- format: health/format_failure_share > `health.format_share`;
- likelihood: health/right_logprob fell below the previous step's by more than `health.likelihood_tol`
  (a step without a right trajectory ends the streak).

An alarm fires once its streak reaches `health.patience`; memrl.training.trainer then acts as
trainer.on_collapse says (warn, stop, rollback) when the alarm is one of `health.guard`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from memrl.config import MAX_COEF, MAX_COUNT, valid

ALARMS: tuple[str, ...] = ("dead", "format", "likelihood")
"""The alarms HealthMonitor counts (module docstring)."""

ON_COLLAPSE: tuple[str, ...] = ("warn", "stop", "rollback")
"""trainer.on_collapse: what the guard does when an alarm of health.guard fires."""

RIGHT = "health/right_logprob"


@dataclass
class HealthSection:
    """The alarms' thresholds and the guard's rollback (docs/guides/health.md); trainer.on_collapse chooses
    what a firing alarm does."""

    patience: int = valid(3, ge=1, le=MAX_COUNT)
    """k: an alarm fires once its condition held k steps in a row."""
    window: int = valid(5, ge=2, le=MAX_COUNT)
    """Steps of health/reward_trend's slope and of the mean health/right_logprob_delta compares with."""
    dead_reward: float = valid(0.0, ge=-MAX_COEF, le=MAX_COEF)
    """dead: no sampled reward above this, every group zero-variance (0: every trajectory scored 0)."""
    format_share: float = valid(0.5, ge=0, le=1)
    """format: the share of trajectories with a format error above which the step counts."""
    likelihood_tol: float = valid(0.0, ge=0, le=MAX_COEF)
    """likelihood: a step counts when health/right_logprob is below the previous step's minus this."""
    guard: list[str] = valid(default_factory=lambda: list(ALARMS), choices=ALARMS)
    """The alarms trainer.on_collapse acts on (every alarm is logged and shown either way)."""
    max_rollbacks: int = valid(2, ge=0, le=MAX_COUNT)
    """on_collapse=rollback: rollbacks allowed in the run; a collapse after the last one stops it."""
    rollback_lr_scale: float = valid(0.5, gt=0, le=1)
    """on_collapse=rollback: the learning rate (peak and schedule) is multiplied by this at each rollback."""
    rollback_reseed: bool = True
    """on_collapse=rollback: each rollback gives the rollouts new sampling seeds (the step's seed plus
    rollbacks x 1,000,000); False resamples with the seeds the collapsed steps had."""


@dataclass
class Alarm:
    """An alarm that fired this step: its name, its streak and the one-line reason."""

    name: str
    streak: int
    reason: str


def _is_right(t: Any) -> bool:
    r = t.metrics.get("outcome_reward", t.reward)  # a model-scored reward keeps the outcome there
    return r is not None and float(r) > 0


def _truncated(t: Any) -> bool | None:
    """Whether trajectory `t` was cut short; None when its workflow records neither sign."""
    finishes = [s.info["finish_reason"] for s in t.segments if "finish_reason" in s.info]
    if "overlong" not in t.info and not finishes:
        return None
    return bool(t.info.get("overlong")) or "length" in finishes


def rollout_health(res: Any, format_keys: tuple[str, ...]) -> dict[str, float]:
    """The step's health/* metrics that its rollout `res` (memrl.training.step.rollout.RolloutResult) gives (module
    docstring); those a workflow has no data for are left out (no format keys, finish reasons, right answer)."""
    groups, all_rewards, sampled_groups, dropped_groups = res.groups, res.all_rewards, res.sampled_groups, \
        res.dropped_groups
    trajs = [t for g in groups for t in g.trajectories]
    out: dict[str, float] = {}
    if format_keys and trajs:
        bad = sum(1 for t in trajs if any(float(t.metrics.get(k, 0.0)) > 0 for k in format_keys))
        out["health/format_failure_share"] = bad / len(trajs)
    cut = [c for c in (_truncated(t) for t in trajs) if c is not None]
    if cut:
        out["health/truncation_share"] = sum(cut) / len(cut)
    if sampled_groups:
        flat = sum(1 for g in groups if len(set(g.rewards)) <= 1)
        out["health/zero_variance_share"] = (flat + dropped_groups) / sampled_groups
    if all_rewards:
        out["health/reward_mean"] = statistics.fmean(all_rewards)
        out["health/reward_max"] = max(all_rewards)
    lps = [lp for t in trajs if _is_right(t) for s in t.segments
           for lp, m in zip(s.response_logprobs, s.loss_mask or [], strict=True) if m]
    if lps:
        out[RIGHT] = statistics.fmean(lps)
    return out


def slope(ys: list[float]) -> float:
    """Least-squares slope of ys against 0, 1, ..., len(ys) - 1 (0 for fewer than 2 values)."""
    n = len(ys)
    if n < 2:
        return 0.0
    xm, ym = (n - 1) / 2, statistics.fmean(ys)
    return sum((x - xm) * (y - ym) for x, y in enumerate(ys)) / sum((x - xm) ** 2 for x in range(n))


@dataclass
class HealthMonitor:
    """The health state a run carries from step to step (saved in each checkpoint: `saved` / `restore`)."""

    cfg: HealthSection
    rewards: list[float] = field(default_factory=list)
    """reward/mean of the last `window` steps (this one last)."""
    right: list[float] = field(default_factory=list)
    """health/right_logprob of the last `window` steps that had a right trajectory."""
    last_right: float | None = None
    """The previous step's health/right_logprob (None: it had no right trajectory)."""
    streaks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ALARMS, 0))
    rollbacks: int = 0
    """Rollbacks done in this run (on_collapse=rollback); never undone by one."""

    @classmethod
    def resumed(cls, cfg: HealthSection, state: dict[str, Any] | None) -> HealthMonitor:
        """A monitor holding a checkpoint's `saved()` state (None: a fresh run)."""
        out = cls(cfg)
        out.restore(state)
        return out

    def observe(self, metrics: dict[str, float]) -> list[Alarm]:
        """Add the trend and delta metrics to the step's `metrics` (which hold its health/* from
        rollout_health and the update's loss/entropy), advance the streaks, and return the alarms that fire."""
        c = self.cfg
        if "loss/entropy" in metrics:
            metrics["health/entropy"] = metrics["loss/entropy"]
        reward = metrics.get("health/reward_mean")
        if reward is not None:
            self.rewards = (self.rewards + [reward])[-c.window:]
            metrics["health/reward_trend"] = slope(self.rewards)
        right = metrics.get(RIGHT)
        if right is not None and self.right:
            metrics["health/right_logprob_delta"] = right - statistics.fmean(self.right)
        held = {
            "dead": metrics.get("health/zero_variance_share") == 1.0
            and metrics.get("health/reward_max", 0.0) <= c.dead_reward
            and metrics.get("advantage/max", 0.0) == 0.0 and metrics.get("advantage/min", 0.0) == 0.0,
            "format": metrics.get("health/format_failure_share", 0.0) > c.format_share,
            "likelihood": right is not None and self.last_right is not None and right < self.last_right - c.likelihood_tol,
        }
        if right is not None:
            self.right = (self.right + [right])[-c.window:]
        self.last_right = right
        fired = []
        for name in ALARMS:
            self.streaks[name] = self.streaks[name] + 1 if held[name] else 0
            metrics[f"health/streak/{name}"] = float(self.streaks[name])
            if self.streaks[name] >= c.patience:
                fired.append(Alarm(name, self.streaks[name], self._reason(name, metrics)))
        metrics["health/alarms"] = float(len(fired))
        metrics["health/rollbacks"] = float(self.rollbacks)
        return fired

    def _reason(self, name: str, m: dict[str, float]) -> str:
        k = self.streaks[name]
        if name == "dead":
            return f"every group had zero reward variance with no reward above {self.cfg.dead_reward:g} for {k} steps"
        if name == "format":
            return (f"format failures in {m['health/format_failure_share']:.0%} of trajectories (> "
                    f"{self.cfg.format_share:.0%}) for {k} steps")
        return f"the log-likelihood of right answers fell for {k} steps (now {m[RIGHT]:.4f})"

    def saved(self) -> dict[str, Any]:
        """What a checkpoint keeps (plain numbers and lists)."""
        return {"rewards": list(self.rewards), "right": list(self.right), "last_right": self.last_right,
                "streaks": dict(self.streaks), "rollbacks": self.rollbacks}

    def restore(self, state: dict[str, Any] | None, keep_rollbacks: bool = False) -> None:
        """Back to a checkpoint's `saved()` (None: a run's start); `keep_rollbacks`: a rollback keeps its count."""
        state = state or {}
        self.rewards = [float(x) for x in state.get("rewards", [])]
        self.right = [float(x) for x in state.get("right", [])]
        last = state.get("last_right")
        self.last_right = None if last is None else float(last)
        self.streaks = {a: int((state.get("streaks") or {}).get(a, 0)) for a in ALARMS}
        if not keep_rollbacks:
            self.rollbacks = int(state.get("rollbacks", 0))

    def streak_start(self, alarms: list[Alarm], step: int) -> int:
        """The first step of the longest streak among `alarms`, which fired at `step` (1-based steps)."""
        return step - max(a.streak for a in alarms) + 1
