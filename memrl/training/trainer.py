"""The RL driver loop. `Trainer.fit` runs `Trainer.train_step` over the parts of a run that
memrl.training.assemble built from its config (workers, engine, the run's RolloutRuntime with its
services, the task stream, the dump, the sync stage); one step is the arrow

    sample -> score (tasks -> n trajectories per task through the engine; outcome and step rewards
              returned and applied in one place; dynamic sampling: rounds of both until the batch is full)
    -> advantages (the registered estimator, algorithm.name; rememr1 takes the scored step rewards)
    -> select (algorithm.selection: which segments of each group train; asynchronous: the staleness filter)
    -> update (memrl.training.step.schedule cuts the rows into one or more optimizer steps' mini-batches, each
       weighed once over all of it; each rank trains its share in micro-batches packed by a token budget:
       logprobs recomputed as log_softmax(logits / T) -> PPO loss -> optimizer step; one learning-rate
       scheduler step per RL step)
    -> sync (memrl.training.sync.engine_sync: the engine(s) get the new weights)

timed by a stage timer and logged by memrl.training.step.step_metrics around it; then validation, the health
alarms (memrl.training.monitor.guard acts on them), the best checkpoint, the metrics row, checkpoints. The engine's
weights are synced once more before the first rollout of every run (fresh or resumed), so an engine that
loaded other weights (a server started on the initial model) never samples from them.

Same code on a laptop CPU and a GPU; only `model.device` / `engine.name` / the placement change.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from memrl import threads
from memrl.algorithms.advantages import compute_group_advantages
from memrl.algorithms.selection import segment_selection, selection_rng
from memrl.config import to_yaml
from memrl.engines.base import NonFiniteLogprobError
from memrl.errors import UserError, disk_full
from memrl.rewards.registry import NONE
from memrl.training.assemble import RunParts, task_stream
from memrl.training.checkpoints import checkpoint as ckpt
from memrl.training.monitor import guard, health
from memrl.training.monitor.metrics_log import MetricsLogger
from memrl.training.monitor.trackers import open_trackers
from memrl.training.step.async_rollout import Producer, partial_metrics, stale_filter
from memrl.training.step.rollout import RolloutResult, asample_groups
from memrl.training.step.schedule import optimizer_steps, rank_steps
from memrl.training.step.step_extras import aepo_select, apply_model_reward
from memrl.training.step.step_metrics import (
    EngineBusy,
    StageTimer,
    advantage_metrics,
    combine_step_metrics,
    rollout_metrics,
    step_metrics,
)
from memrl.training.step.validation import keep_best, restore_best, run_validation
from memrl.training.update.packing import TrainBatch, weigh, weigh_shares
from memrl.types import Group, Segment, Task

log = logging.getLogger(__name__)


def stop_if_not_finite(metrics: dict[str, float], step: int) -> None:
    """A nan / inf loss or gradient norm ends the run here, before the weights reach the engine or a
    checkpoint (the worker skipped the optimizer step): one line naming the values."""
    bad = {k: v for k, v in metrics.items()
           if (k.startswith("loss/") or k == "train/grad_norm") and not math.isfinite(v)}
    if bad:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))
        raise UserError(f"step {step}: training diverged ({shown}); stopped without saving this step "
                        "(lower optim.lr or check the rewards and advantages)")


class NonFiniteModelError(UserError):
    """The policy produced NaN / inf log-probabilities in a rollout: the run stops, naming the step."""


def non_finite_logprobs(e: BaseException | None) -> bool:
    """Whether `e` or an error it was raised from is a model's non-finite log-probability (the hf engine's
    NonFiniteLogprobError, or the Segment check other engines' replies meet)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NonFiniteLogprobError) or "response_logprobs must be finite" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


class Trainer:
    """RL training of one policy on one workflow: `Trainer(assemble(cfg)).fit()` runs `trainer.steps`
    steps (a resumed run from the step its checkpoint holds). `on_step(step, metrics)` is called after
    each logged step."""

    def __init__(self, parts: RunParts, on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self.parts, self.cfg, self.state, self.on_step = parts, parts.cfg, parts.state, on_step
        self.timer = StageTimer()
        self.engine_busy = EngineBusy(parts.engine)
        self.producer: Producer | None = None  # asynchronous training: started with the first step
        self.dumped_rows: list[dict[str, Any]] = []  # the last step's dump, logged as a table by fit()
        self.health = health.HealthMonitor.resumed(self.cfg.health, self.state.health)  # health/* and alarms

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def model(self) -> Any:
        """The trained module at world size 1 (None for Ray ranks)."""
        return getattr(self.parts.workers, "model", None)

    @property
    def ckpt_root(self) -> Path:
        return self.parts.ckpt_root

    # -------------------------------------------------------------- one step
    def train_step(self) -> dict[str, float]:
        """One RL step: sample -> score -> advantages -> select -> update -> sync (module docstring)."""
        self.timer.reset()
        with self.timer("rollout"):
            res = self.rollout()
            parts = [rollout_metrics(res), health.rollout_health(res, tuple(self.parts.spec.format_keys))]
            if res.groups and self.cfg.algorithm.model_reward != NONE:
                with self.timer("model_reward"):
                    parts.append(apply_model_reward(self.parts, res.groups))
        with self.timer("update"):
            if res.groups:
                self.advantages(res)
                per_group, selected = self.select(res.groups)
                parts += [selected, self.update(per_group, res.groups), advantage_metrics(res.groups), self.sync()]
            self.dumped_rows = self.parts.dump.write(self.step + 1, res.groups)  # every trainer.dump_every steps
        return step_metrics(parts, res, self.timer, self.parts.gate is not None, self.engine_busy(),
                            self.state.position)

    def rollout(self) -> RolloutResult:
        """sample_and_score; a non-finite log-probability in it stops the run naming the step (NonFiniteModelError)."""
        try:
            return self.sample_and_score()
        except Exception as e:
            if not non_finite_logprobs(e):
                raise
            raise NonFiniteModelError(ckpt.non_finite_message(e, self.step, self.ckpt_root, self.cfg.model.path)) from e

    # -------------------------------------------------------------- the stages
    def sample_and_score(self) -> RolloutResult:
        """sample -> score on the run's runtime (with dynamic sampling: rounds of both until the batch is
        full or the refills run out); the scores are applied onto the kept groups' trajectories.
        Asynchronous training: the batch the producer sampled for this step (memrl.training.step.async_rollout)."""
        p, a = self.parts, self.cfg.algorithm
        if p.gate is not None:
            if self.producer is None:
                self.producer = Producer(
                    p.runtime, p.gate, p.stream, self.state.position, start=self.step, steps=self.cfg.trainer.steps,
                    max_staleness=self.cfg.rollout.max_staleness, batch_size=self.cfg.trainer.batch_size, n=a.n,
                    seed_of=self.rollout_seed, dynamic_sampling=a.dynamic_sampling,
                    max_refill_rounds=a.max_refill_rounds)
                self.producer.begin()
            res = p.runtime.run(self.producer.take(self.step))
            self.state.position = res.end_position
            return res
        return p.runtime.run(asample_groups(
            self._next_tasks, p.runtime, self.cfg.trainer.batch_size, a.n, seed=self.rollout_seed(self.step),
            dynamic_sampling=a.dynamic_sampling, max_refill_rounds=a.max_refill_rounds))

    def _next_tasks(self, k: int) -> list[Task]:
        tasks = [next(self.parts.stream) for _ in range(k)]
        self.state.position += k
        return tasks

    def rollout_seed(self, step: int) -> int:
        """The sampling seed of step `step`'s batch (0-based), in either mode."""
        return self.cfg.trainer.seed * 100003 + step + guard.seed_offset(self.cfg.health, self.health.rollbacks)

    def advantages(self, res: RolloutResult) -> None:
        """The registered estimator (algorithm.name) over the kept groups, from their outcome rewards and
        the step rewards the score stage returned; writes Segment.advantage."""
        steps = [[sc.step_rewards for sc in per_group] for per_group in res.scores]
        compute_group_advantages(res.groups, self.cfg.algorithm.name, self.parts.adv_options, step_rewards=steps)

    def select(self, groups: list[Group]) -> tuple[list[list[Segment]], dict[str, float]]:
        """algorithm.selection: the segments of each group that become rows (all of them with "all"), and
        its dcpo/* metrics; asynchronous training: no segment older than rollout.max_staleness versions
        trains (async/* metrics)."""
        a, metrics = self.cfg.algorithm, {}
        if a.selection == "all":
            per_group = [g.segments() for g in groups]
        else:
            per_group, metrics = segment_selection(groups, a.selection, a.segments_per_task,
                                                   selection_rng(self.cfg.trainer.seed, self.step))
        if self.parts.gate is not None:
            per_group, stale = stale_filter(per_group, self.step, self.cfg.rollout.max_staleness)
            metrics = {**metrics, **stale, **partial_metrics(groups)}
        return per_group, metrics

    def update(self, per_group: list[list[Segment]], groups: list[Group] | None = None) -> dict[str, float]:
        """The selected segments of each group -> rows -> PPO update(s) over micro-batches; returns loss
        statistics (memrl.training.step.step_metrics.combine_step_metrics over the optimizer steps). With
        algorithm.old_logprobs=trainer the rows' old logprobs are recomputed first (Segment.old_logprobs);
        with algorithm.aepo.enabled that pass also gives the batch's entropy, and AEPO's gate may drop the
        rows without a positive advantage and reward (`groups`: their trajectories' rewards)."""
        release = getattr(self.parts.engine, "release_memory", None)  # colocated vLLM sleeps during the update
        if release is not None and self.parts.gate is None:  # (asynchronous: the engines keep sampling)
            release()
        a, extra = self.cfg.algorithm, {}
        if a.old_logprobs == "trainer":
            with self.timer("old_logprobs"):  # one forward over every row, before the first optimizer step
                rows = list({id(s): s for segs in per_group for s in segs}.values())
                if a.aepo.enabled:
                    lps, ents = self.parts.workers.old_logprobs_entropy(rows)
                else:
                    lps, ents = self.parts.workers.old_logprobs(rows), []
                for s, lp in zip(rows, lps, strict=True):
                    s.old_logprobs = lp
            if a.aepo.enabled:
                per_group, extra = aepo_select(a, per_group, rows, ents, groups or [])
                if not any(per_group):  # the gate left no row: no optimizer step this RL step
                    log.warning("step %d: AEPO's gate left no row to train (entropy %.4f)", self.step + 1,
                                extra["aepo/entropy"])
                    return extra
        t, mode = self.cfg.trainer, self.cfg.algorithm.loss_agg
        # each mini-batch weighed once here (one weight per row): over all of it, or per_rank over each slice
        # of the published run's rank shares; memrl's own ranks then get token-balanced shares of it
        if t.loss_weights == "per_rank":
            steps = [weigh_shares(shares, mode, t.mini_batch_ranks)
                     for shares in rank_steps(per_group, t.mini_batches, t.mini_batch_ranks)]
        else:
            steps = [weigh(part, mode) for part in optimizer_steps(
                per_group, t.mini_batches, t.mini_batch_split, t.mini_batch_rows, t.mini_batch_rows_tail,
                t.mini_batch_ranks)]
        return {**extra, **combine_step_metrics([self.train_rows(batch, step_scheduler=j == len(steps) - 1)
                                                 for j, batch in enumerate(steps)])}

    def train_rows(self, batch: TrainBatch, step_scheduler: bool = True) -> dict[str, float]:
        """One optimizer step on the weighed mini-batch `batch` (memrl.training.ranks.worker_group: each rank
        trains its share, PolicyWorker.train_rows); `step_scheduler`: advance the learning-rate schedule
        after it (once per RL step)."""
        out = self.parts.workers.train_rows(batch, step_scheduler)
        stop_if_not_finite(out, self.step + 1)
        return out

    def sync(self, first: bool = False) -> dict[str, float]:
        """The engine(s) get the policy's weights (memrl.training.sync.engine_sync): after this step's update, or
        `first`, before the first rollout of the run."""
        if first:
            return self.parts.sync(self.step, "before the first rollout")
        return self.parts.sync(self.step + 1, f"after the update of step {self.step + 1}")

    # -------------------------------------------------------------- the loop
    def fit(self) -> list[dict[str, float]]:
        """Run (or resume) training; returns the logged metrics of the steps run now. Closes the parts."""
        cfg = self.cfg
        try:
            self.sync(first=True)  # the engine may hold other weights than the policy
            (self.parts.out / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
            logger = MetricsLogger(self.parts.out, cfg.trainer.tensorboard and "tensorboard" in cfg.trainer.loggers,
                                   cfg.trainer.steps, self.step, cfg.trainer.progress, desc="rl",
                                   keep_until=self.step, trackers=self._open_trackers())
            try:
                return self._loop(logger)
            finally:
                logger.close()
        finally:
            self.close()

    def _loop(self, logger: MetricsLogger) -> list[dict[str, float]]:
        cfg = self.cfg
        if logger.dropped:
            log.warning("%s: replaced %d row(s) of steps after %d, which are redone", logger.path,
                        logger.dropped, self.step)
        self.parts.dump.truncate(self.step)  # trajectories.jsonl likewise holds each step once
        guard.begin(self)  # memrl.training.monitor.guard: health_events.jsonl cut back; rollback: the step-0 checkpoint
        if cfg.trainer.save_best:
            restore_best(self.ckpt_root, self.state.best)  # what a kill while replacing checkpoints/best left
        history, thread_row = [], threads.metrics(threads.in_effect())  # every row says what threads it ran with
        if self.step == 0 and cfg.trainer.val_every and cfg.val.before_train:  # initial weights, as step 0
            logger.log(0, self.validate_step(0))
        while self.step < cfg.trainer.steps:
            metrics = {**self.train_step(), **thread_row}
            self.state.step += 1
            if cfg.trainer.val_every and self.step % cfg.trainer.val_every == 0:
                metrics.update(self.validate_step(self.step))
            alarms = self.health.observe(metrics)  # health/* trends, streaks and alarms
            logger.log(self.step, metrics)  # before a save: a kill inside it must not lose the row
            if alarms and guard.act(self, alarms, metrics, logger):  # on_collapse: stop raises; rollback went back
                continue
            saved = keep_best(cfg.trainer, self.state, self.step, metrics, self.save)  # trainer.save_best
            if self.dumped_rows:  # memrl.training.monitor.dump: this step's sample
                logger.table(self.step, self.dumped_rows)
            history.append(metrics)
            if self.on_step is not None:
                self.on_step(self.step, metrics)
            every = cfg.trainer.save_every
            if not saved and ((every and self.step % every == 0) or self.step == cfg.trainer.steps):
                self.save()
        return history

    def close(self) -> None:
        """End the run: the runtime (services' clients, engine, event loop), then the workers (fit() calls it)."""
        self.parts.close()

    def _open_trackers(self) -> list[Any]:
        """wandb / mlflow trackers of trainer.loggers, continuing the runs the checkpoint names."""
        t = self.cfg.trainer
        if not {"wandb", "mlflow"} & set(t.loggers):
            return []
        text = to_yaml(self.cfg)
        made = open_trackers(t.loggers, self.parts.out, self.state.tracker_ids, yaml.safe_load(text), text,
                             t.mlflow_uri)
        self.state.tracker_ids = {tr.name: tr.run_id for tr in made}
        return made

    def validate_step(self, step: int) -> dict[str, float]:
        """Validation of the current weights (memrl.training.step.validation): val/... metrics of `step`."""
        t0 = time.perf_counter()
        metrics = run_validation(self.cfg, self.parts.out, step, engine=self.parts.engine, runtime=self.parts.runtime)
        metrics["time/val_s"] = time.perf_counter() - t0
        return metrics

    def restore(self, checkpoint: Path, state: dict[str, Any], lr_scale: float = 1.0) -> None:
        """Back to `checkpoint` in place (`state`: its trainer state, as verify_checkpoint reads it): the workers'
        weights and optimizer (the learning rate times `lr_scale`), the RNG, the loop's step, data position and
        best, the health monitor's trends (its rollback count is the caller's), the task stream at that
        position, and the trajectory dump cut back to that step. The engines keep their weights until the next
        sync (`sync(first=True)`)."""
        self.parts.workers.load_checkpoint(str(checkpoint), lr_scale)
        ckpt.set_rng_state(state["rng"])
        s = self.state
        s.step, s.position, s.best = int(state["step"]), int(state["data_position"]), state.get("best")
        self.health.restore(state.get("health"), keep_rollbacks=True)
        self.parts.stream = task_stream(self.cfg, s.position, self.parts.tasks)
        self.parts.dump.truncate(s.step)

    def save(self) -> Path:
        """Checkpoint the current step: the workers' weights and optimizer, the RNG and the loop state."""
        in_flight = self.producer.in_flight(self.step) if self.producer is not None else None
        state = {"rng": ckpt.rng_state(), **self.state.saved(in_flight), "health": self.health.saved()}
        try:
            return self.parts.workers.save(self.ckpt_root, self.step, state, keep=self.cfg.trainer.keep_checkpoints,
                                           extra_files={"config.yaml": to_yaml(self.cfg)})
        except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            if not disk_full(e):
                raise
            raise ckpt.CheckpointError(ckpt.disk_full_message(self.ckpt_root, self.step, self.cfg.out_dir)) from e
