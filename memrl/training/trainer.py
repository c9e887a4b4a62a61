"""The RL driver loop. One step of `Trainer.fit` (`Trainer.train_step`), on the run's RolloutRuntime
(memrl.runtime: one event loop, the engine and the services for the whole fit()):

    sample (tasks -> n trajectories per task, concurrent, through the engine; generation only)
    -> score (outcome and step rewards returned per trajectory; applied onto the trajectories in one place)
    -> optional dynamic sampling (drop zero-variance groups, refill: sample -> score again)
    -> advantages (registry; rememr1 takes the scored step rewards)
    -> selection [algorithm.selection: segments_per_task segments per task selected]
    -> the update schedule (memrl.training.schedule: trainer.mini_batches / mini_batch_split /
       mini_batch_rows) cuts the rows into the mini-batches of one or more optimizer steps
    -> each mini-batch's rows packed into micro-batches by a token budget
    -> logprobs recomputed as log_softmax(logits / T) -> PPO loss, gradients accumulated with weights
       fixed over the whole mini-batch (sum of micro-batch losses == un-split loss) -> optimizer step
    -> (after the last mini-batch) one learning-rate scheduler step
    -> weight sync to the engine -> log -> checkpoint

The engine's weights are synced once more before the first rollout of every run (fresh or resumed), so
an engine that loaded other weights (a server started on the initial model) never samples from them.

Same code on a laptop CPU and a GPU; only `model.device` / `engine.name` change.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from memrl.config import ConfigError, check_config, check_shared_fields, to_yaml
from memrl.engines.base import SamplingParams
from memrl.errors import UserError, model_dir, writable_dir
from memrl.training import adapter_sync
from memrl.training.checkpoint import clean_stale, resume_point, rng_state, set_rng_state
from memrl.training.config import TrainConfig
from memrl.training.dump import TrajectoryDump
from memrl.training.lora import base_source, engine_policy, engine_weights, save_engine_dir
from memrl.training.packing import TrainBatch, weigh
from memrl.training.rollout import RolloutResult, asample_groups
from memrl.training.schedule import optimizer_steps
from memrl.types import Group, Segment, Task
from memrl.workflows import format_counts, format_keys

log = logging.getLogger(__name__)


def check_writable(out_dir: str | os.PathLike, key: str = "out_dir") -> Path:
    """Create `out_dir` and prove we can write in it, before any expensive work starts."""
    return writable_dir(out_dir, key)


def workflow_config(cfg: TrainConfig) -> tuple[Any, Any]:
    """(WorkflowSpec, typed workflow config) from the `workflow` section and the spec's train_defaults;
    sampling runs at algorithm.temperature, because the trainer recomputes logprobs at that temperature."""
    from memrl.workflows import parse_workflow

    spec, wf = parse_workflow(cfg.workflow, defaults={"temperature": cfg.algorithm.temperature}, stage="train")
    check_shared_fields(wf, SamplingParams, "workflow")  # top_p / top_k before any model loads
    t = getattr(wf, "temperature", cfg.algorithm.temperature)
    if float(t) != float(cfg.algorithm.temperature):
        raise ConfigError(
            f"workflow.temperature={t} differs from algorithm.temperature={cfg.algorithm.temperature}; "
            "logprobs must be recomputed at the sampling temperature"
        )
    return spec, wf


def validate(cfg: TrainConfig) -> tuple[Any, Any]:
    """Fail fast, naming the field, before any work: every field against its declared range or set
    (`memrl.config.check_config`), then what involves several fields (`TrainConfig.check()`: each section's
    `check()` in memrl.training.config, then what spans sections; the val section's files and metric,
    memrl.training.validation.check); returns the parsed workflow (spec, config), which
    `Trainer(cfg, workflow=...)` takes so it is parsed once."""
    check_config(cfg)
    cfg.check()
    from memrl.training.validation import check as check_validation

    check_validation(cfg)
    return workflow_config(cfg)


def check_loggers(cfg: TrainConfig) -> None:
    """trainer.loggers: jsonl always, each name once, installed (`TrainerSection.check_loggers`)."""
    cfg.trainer.check_loggers()


def algorithm_options(cfg: TrainConfig) -> tuple[Any, Any]:
    """The options of the chosen advantage estimator and loss, filled from algorithm.* (their
    registered options dataclasses; None for one registered without): `AlgorithmSection.options`."""
    return cfg.algorithm.options()


def file_tasks(cfg: TrainConfig) -> list[Task] | None:
    """The tasks of `data.path` (None for synthetic data); the Trainer reads them before any model loads,
    so a bad file (duplicate ids, unscorable rows) fails in seconds."""
    if cfg.data.name == "synthetic":
        return None
    from memrl.data.io import load_tasks

    tasks = load_tasks(cfg.data.path, docs_from=cfg.data.docs_from or None)
    if not tasks:
        raise UserError(f"data.path {cfg.data.path} holds no tasks")
    return tasks


def task_stream(cfg: TrainConfig, start: int, tasks: list[Task] | None = None) -> Iterator[Task]:
    """The training tasks from position `start` on (synthetic: endless; file: epochs of `tasks`, read from
    data.path when not given, each in a new seeded order, or in the file's order with data.shuffle=false)."""
    if cfg.data.name == "synthetic":
        from memrl.data.synthetic import task_stream as synthetic_stream

        return synthetic_stream(cfg.data.synthetic, cfg.data.seed, start)
    if tasks is None:
        tasks = file_tasks(cfg)
    assert tasks is not None

    def epochs() -> Iterator[Task]:
        for epoch in itertools.count():
            order = list(range(len(tasks)))
            if cfg.data.shuffle:  # False: the file's order every epoch (verl's SequentialSampler)
                random.Random(f"{cfg.data.seed}:{epoch}").shuffle(order)
            for i in order:
                t = tasks[i]
                yield Task(f"{t.task_id}@e{epoch}", t.question, t.context, t.answers, t.meta)

    return itertools.islice(epochs(), start, None)


def selection_rng(seed: int, step: int) -> random.Random:
    """The rng of step `step`'s segment selection: from the seed and step alone, so resume is exact
    (the string is the one memrl used before selection had its own key, so old runs select alike)."""
    return random.Random(f"dcpo:{seed}:{step}")


def segment_selection(
    groups: list[Group], rule: str, per_task: int, rng: random.Random
) -> tuple[list[list[Segment]], dict[str, float]]:
    """`algorithm.selection` (not "all"): per group (in order, one rng), the segments that train
    (memrl.algorithms.selection.select_segments). Returns (selected segments per group, dcpo/* metrics;
    `dcpo/repeated` counts rows that repeat a segment already selected, which only "published" makes)."""
    from memrl.algorithms.selection import select_segments

    chosen = select_segments(groups, rule, per_task, rng)
    trajs = [t for g in groups for t in g.trajectories]
    available = sum(len(t.segments) for t in trajs)
    pruned = [len(t.segments) > 1 or float(t.metrics.get("prunes", 0) or 0) > 0 for t in trajs]
    selected = sum(len(c) for c in chosen)
    metrics = {
        "dcpo/segments_per_trajectory": available / len(trajs) if trajs else 0.0,
        "dcpo/selected": float(selected),
        "dcpo/available": float(available),
        "dcpo/repeated": float(selected - sum(len({id(s) for s in c}) for c in chosen)),
        "dcpo/pruned_share": statistics.fmean(pruned) if pruned else 0.0,
    }
    return chosen, metrics


COUNTED = ("train/rows", "train/tokens", "train/micro_batches", "train/rows_zero_adv_skipped")
"""Per-step metrics that count things: summed over an RL step's optimizer steps (the rest are averaged)."""


MISMATCH_TOKENS = "/tokens"


def _is_mismatch_mean(key: str) -> bool:
    return key.startswith("mismatch/") and not key.endswith(MISMATCH_TOKENS)


def _mismatch_tokens(key: str) -> str:
    return key.rsplit("/", 1)[0] + MISMATCH_TOKENS


def combine_step_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """One RL step's metrics from its optimizer steps' (memrl.training.schedule): counts summed, train/lr
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


def _stats(prefix: str, xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {f"{prefix}/mean": statistics.fmean(xs), f"{prefix}/std": statistics.pstdev(xs),
            f"{prefix}/max": max(xs), f"{prefix}/min": min(xs)}


ROLLOUT_METRICS = ("answer_seen", "answer_kept", "memory_tokens_mean")
"""Trajectory metrics logged as rollout/<key> (MemAgent's names since the start); every other numeric
trajectory metric is logged as traj/<key>."""


def rollout_metrics(res: RolloutResult) -> dict[str, float]:
    """The metrics of a step's rollout: reward/* over every sampled trajectory, group counts, and the
    workflow's own trajectory metrics over the kept ones: format/<key> (trajectories with that format
    error), judge/<kind> (MemAct's LLM judge: trajectories per verdict / failure / exclusion), and the
    mean of every other numeric trajectory metric some trajectory of the step reports (over those that
    report it): rollout/<key> for ROLLOUT_METRICS, traj/<key> for the rest. A workflow logs only the
    metrics it has (a MemAct run has no rollout/memory_tokens_mean)."""
    metrics: dict[str, float] = {}
    trajs = [t for g in res.groups for t in g.trajectories]
    metrics.update(_stats("reward", res.all_rewards))
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


class Trainer:
    """RL training of one policy on one workflow. `fit()` runs `trainer.steps` steps (resuming from the
    latest checkpoint in `out_dir/checkpoints` when `resume=True`)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False,
                 on_step: Callable[[int, dict[str, float]], None] | None = None,
                 workflow: tuple[Any, Any] | None = None) -> None:
        """`workflow`: the (spec, config) `validate(cfg)` returned, when the caller validated already."""
        self.spec, self.wf_cfg = workflow if workflow is not None else validate(cfg)
        self.adv_options, self.loss_options = algorithm_options(cfg)
        self.cfg = cfg
        self.out = check_writable(cfg.out_dir)
        model_dir(cfg.model.path, "model.path")  # before any work, not deep inside transformers
        self.tasks = file_tasks(cfg)  # data errors too, before any model loads
        self.resume = resume
        self.on_step = on_step

    # -------------------------------------------------------------- setup
    def setup(self) -> None:
        """Load (or resume) the workers and engines without training; `fit` runs it when needed."""
        self._load()

    def _load(self) -> None:
        from transformers import AutoTokenizer

        from memrl.training.placement import RayEngines, connect, uses_ray
        from memrl.training.workers import build_workers

        cfg = self.cfg
        self.ckpt_root = self.out / "checkpoints"
        clean_stale(self.ckpt_root)
        point = resume_point(self.ckpt_root) if self.resume else None
        if self.resume and point is None:
            log.warning("--resume: no checkpoint in %s; starting from step 0", self.ckpt_root)
        start = point.path if point is not None else None
        src = base_source(cfg.model, start)  # LoRA: engines start from the base (a checkpoint holds the adapter)
        if uses_ray(cfg):
            connect(cfg)  # address and resources checked before any model is loaded
        self.tokenizer = AutoTokenizer.from_pretrained(src)
        self.workers = build_workers(cfg, start)  # model, KL reference, optimizer, scheduler (resumed)
        self.model = self.workers.model  # the live module at world size 1 (None for Ray ranks)
        self.opt = self.workers.opt
        self.step = 0
        self.position = 0
        self.tracker_ids: dict[str, str] = {}  # wandb / mlflow run ids (memrl.training.trackers), resumed
        self.best: dict[str, Any] | None = None  # trainer.save_best: {"metric", "value", "step"} so far
        random.seed(cfg.trainer.seed)
        torch.manual_seed(cfg.trainer.seed)
        if start is not None:
            state = point.state
            set_rng_state(state["rng"])
            self.step, self.position = int(state["step"]), int(state["data_position"])
            self.tracker_ids, self.best = dict(state.get("trackers") or {}), state.get("best")
            log.warning("resumed from %s (step %d, data position %d)", start, self.step, self.position)
            if state.get("async_in_flight"):
                log.warning("asynchronous run: the %d rollout batch(es) sampled ahead of step %d when it was saved "
                            "were discarded; their tasks (from data position %d) are sampled again",
                            state["async_in_flight"], self.step, self.position)
        try:
            if cfg.rollout.num_engines > 0:
                from memrl.training.weight_sync import WeightSync

                self.engine = RayEngines(cfg, src, self.tokenizer, self.workers.pg)
                self.weight_sync = WeightSync(cfg, self.workers, self.engine, self.out)
            else:
                self.engine = self._build_engine(src)
            self._start_run()  # the run's RolloutRuntime exists before the first sync (its check uses its loop)
            self.sync_weights()  # before the first rollout: the engine may hold other weights than the policy
        except BaseException:
            runtime = getattr(self, "runtime", None)
            if runtime is not None:
                runtime.close()
            self.workers.close()  # Ray actors and placement groups are not left behind
            raise

    def _start_run(self) -> None:
        """What a loaded trainer needs to run: the task stream from the current position, the trajectory
        dump and the run's RolloutRuntime (one event loop, the engine and the services until fit() ends)."""
        from memrl.runtime import RolloutRuntime

        cfg = self.cfg
        self.stream = task_stream(cfg, self.position, self.tasks)
        self.dump = TrajectoryDump(self.out, cfg.trainer, str(cfg.workflow["name"]), getattr(self, "tokenizer", None))
        self.dumped_rows: list[dict[str, Any]] = []  # the last train_step's dump, logged as a table by fit()
        r = cfg.rollout
        self.producer: Any = None  # asynchronous training: memrl.training.async_rollout.Producer, from step 1
        self.gate: Any = None
        self.runtime = RolloutRuntime(self.engine, self.spec, self.wf_cfg, concurrency=cfg.trainer.concurrency,
                                      background=r.max_staleness > 0)
        if r.max_staleness > 0:  # the producer samples through the gate a weight sync closes
            from memrl.engines.versioned import VersionedEngine

            self.gate = VersionedEngine(self.engine, self.step, abort=r.partial == "abort",
                                        max_aborts=r.partial_max_aborts)
        self._busy_at: tuple[float, float] | None = None  # (wall, engine busy seconds) at the last step's end

    @classmethod
    def from_parts(cls, cfg: TrainConfig, workers: Any, engine: Any, tokenizer: Any = None,
                   tasks: list[Task] | None = None, workflow: tuple[Any, Any] | None = None) -> Trainer:
        """A trainer over given workers and engine, nothing loaded (no tokenizer, model or checkpoint):
        tests drive `train_step` with a scripted engine and stub workers (memrl.training.workers' protocol:
        train_rows, weights_for_engines, save, close). Starts at step 0; `workflow` as for __init__."""
        self = cls.__new__(cls)
        self.spec, self.wf_cfg = workflow if workflow is not None else workflow_config(cfg)
        self.adv_options, self.loss_options = algorithm_options(cfg)
        self.cfg, self.resume, self.on_step = cfg, False, None
        self.out = check_writable(cfg.out_dir)
        self.tasks = tasks if tasks is not None else file_tasks(cfg)
        self.ckpt_root = self.out / "checkpoints"
        self.tokenizer, self.workers, self.engine = tokenizer, workers, engine
        self.model = getattr(workers, "model", None)
        self.opt = getattr(workers, "opt", None)
        self.step, self.position = 0, 0
        self.tracker_ids, self.best = {}, None
        self._start_run()
        return self

    def _build_engine(self, src: str) -> Any:
        """The rollout engine; one that loads weights itself starts from `src` (the resumed checkpoint)."""
        from memrl.engines import build_engine

        sec = self.cfg.engine
        if sec.name != "hf" and not sec.model:
            sec = dataclasses.replace(sec, model=src)
        policy = self.model
        if sec.name == "hf" and policy is not None:
            policy = engine_policy(policy, sec.hf.share_weights)  # LoRA, a copy: a plain merged module
        lora_rank = self.cfg.model.lora.rank if adapter_sync.mode(self.cfg) == "adapter" else 0
        return build_engine(sec, policy=policy, tokenizer=self.tokenizer, lora_rank=lora_rank)

    def sync_weights(self) -> float:
        """Give the engine(s) the policy's current weights; returns the seconds it took. With
        rollout.sync_check, then proves the engine serves them (memrl.training.sync_check; its metrics
        in `self.sync_checked`). Asynchronous training: the producer's gate is closed around it (no call
        starts, the calls in flight finish on the old weights) and reopened on the new version."""
        from memrl.training.sync_check import check_sync

        first = not getattr(self, "_synced", False)
        if self.gate is not None:
            t0 = time.perf_counter()
            self.runtime.run(self.gate.pause())
            self.gate_wait = time.perf_counter() - t0
        try:
            took = self._sync_weights()
            self._synced = True
            when = "before the first rollout" if first else f"after the update of step {self.step + 1}"
            self.sync_checked = check_sync(self, when)
        finally:
            if self.gate is not None:  # version v = the weights after v updates
                self.aborted = self.runtime.run(self.gate.resume(self.step if first else self.step + 1))
        return took

    def _sync_weights(self) -> float:
        """Ray replicas: rollout.weight_sync (memrl.training.weight_sync). In process: a no-op for an hf
        engine sharing the module, else the state dict; a saved directory for a server (engine.openai.sync_dir);
        with engine.vllm / engine.openai lora_sync=adapter, the adapter (memrl.training.adapter_sync)."""
        if self.cfg.rollout.num_engines > 0:
            return self.weight_sync()
        if adapter_sync.mode(self.cfg) == "adapter":
            if getattr(self, "lora_sync", None) is None:
                e = self.cfg.engine
                root = (Path(e.openai.sync_dir or self.out / "engine_weights") if e.name == "openai"
                        else self.out / adapter_sync.ADAPTER_DIR)
                self.lora_sync = adapter_sync.AdapterSync(self.model, self.engine, root)
            return self.lora_sync()
        t0 = time.perf_counter()
        if self.cfg.engine.name != "openai":
            self.engine.update_weights(engine_weights(self.workers, self.engine))  # LoRA: merged weights
        else:
            d = Path(self.cfg.engine.openai.sync_dir or self.out / "engine_weights")
            save_engine_dir(self.model, self.tokenizer, d)  # LoRA: the merged HuggingFace directory
            self.engine.update_weights(str(d.resolve()))
        return time.perf_counter() - t0

    def _next_tasks(self, k: int) -> list[Task]:
        tasks = [next(self.stream) for _ in range(k)]
        self.position += k
        return tasks

    # -------------------------------------------------------------- the stages of one step
    def sample_and_score(self) -> RolloutResult:
        """sample -> score on the run's runtime (with dynamic sampling: rounds of both until the batch is
        full or the refills run out); the scores are applied onto the kept groups' trajectories.
        Asynchronous training: the batch the producer sampled for this step (memrl.training.async_rollout)."""
        cfg, a = self.cfg, self.cfg.algorithm
        if self.gate is not None:
            if self.producer is None:
                self._start_producer()
            res = self.runtime.run(self.producer.take(self.step))
            self.position = res.end_position
            return res
        return self.runtime.run(asample_groups(
            self._next_tasks, self.runtime, cfg.trainer.batch_size, a.n, seed=self.rollout_seed(self.step),
            dynamic_sampling=a.dynamic_sampling, max_refill_rounds=a.max_refill_rounds))

    def rollout_seed(self, step: int) -> int:
        """The sampling seed of step `step`'s batch (0-based), in either mode."""
        return self.cfg.trainer.seed * 100003 + step

    def _start_producer(self) -> None:
        from memrl.training.async_rollout import Producer

        cfg, a = self.cfg, self.cfg.algorithm
        self.producer = Producer(self.runtime, self.gate, self.stream, self.position, start=self.step,
                                 steps=cfg.trainer.steps, max_staleness=cfg.rollout.max_staleness,
                                 batch_size=cfg.trainer.batch_size, n=a.n, seed_of=self.rollout_seed,
                                 dynamic_sampling=a.dynamic_sampling, max_refill_rounds=a.max_refill_rounds)
        self.producer.begin()

    def advantages(self, res: RolloutResult) -> None:
        """The registered estimator (algorithm.name) over the kept groups, from their outcome rewards and
        the step rewards the score stage returned; writes Segment.advantage."""
        from memrl.algorithms.advantages import compute_group_advantages

        steps = [[sc.step_rewards for sc in per_group] for per_group in res.scores]
        compute_group_advantages(res.groups, self.cfg.algorithm.name, self.adv_options, step_rewards=steps)

    def select(self, groups: list[Group]) -> tuple[list[list[Segment]], dict[str, float]]:
        """algorithm.selection: the segments of each group that become rows (all of them with "all"),
        and its dcpo/* metrics."""
        a = self.cfg.algorithm
        if a.selection == "all":
            return [g.segments() for g in groups], {}
        return segment_selection(groups, a.selection, a.segments_per_task,
                                 selection_rng(self.cfg.trainer.seed, self.step))

    # -------------------------------------------------------------- one update
    def update(self, per_group: list[list[Segment]]) -> dict[str, float]:
        """The selected segments of each group -> rows -> PPO update(s) over micro-batches; returns loss
        statistics."""
        metrics: dict[str, float] = {}
        release = getattr(self.engine, "release_memory", None)  # colocated vLLM sleeps during the update
        if release is not None and self.gate is None:  # (asynchronous: the engines keep sampling)
            release()
        t = self.cfg.trainer
        steps = optimizer_steps(per_group, t.mini_batches, t.mini_batch_split, t.mini_batch_rows,
                                t.mini_batch_rows_tail)
        # each mini-batch weighed once here, over all of it (one weight per row); each rank gets its share
        got = [self.train_rows(weigh(part, self.cfg.algorithm.loss_agg), step_scheduler=j == len(steps) - 1)
               for j, part in enumerate(steps)]
        metrics.update(combine_step_metrics(got))
        return metrics

    def train_rows(self, batch: TrainBatch, step_scheduler: bool = True) -> dict[str, float]:
        """One optimizer step on the weighed mini-batch `batch` (memrl.training.worker_group: each rank
        trains its share, PolicyWorker.train_rows); `step_scheduler`: advance the learning-rate schedule
        after it (once per RL step)."""
        return self.workers.train_rows(batch, step_scheduler)

    # -------------------------------------------------------------- the loop
    def fit(self) -> list[dict[str, float]]:
        """Run (or resume) training; returns the logged metrics of the steps run now."""
        from memrl.training.logging import MetricsLogger

        if not hasattr(self, "workers"):  # setup() may have run already
            self._load()
        cfg = self.cfg
        (self.out / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
        logger = MetricsLogger(self.out, cfg.trainer.tensorboard and "tensorboard" in cfg.trainer.loggers,
                               cfg.trainer.steps, self.step, cfg.trainer.progress, desc="rl",
                               keep_until=self.step, trackers=self._open_trackers())
        if logger.dropped:
            log.warning("%s: replaced %d row(s) of steps after %d, which are redone", logger.path,
                        logger.dropped, self.step)
        self.dump.truncate(self.step)  # trajectories.jsonl likewise holds each step once
        if cfg.trainer.save_best:
            from memrl.training.validation import restore_best

            restore_best(self.ckpt_root, self.best)  # what a kill while replacing checkpoints/best left
        history: list[dict[str, float]] = []
        try:
            if self.step == 0 and cfg.trainer.val_every and cfg.val.before_train:  # initial weights, as step 0
                logger.log(0, self.validate_step(0))
            while self.step < cfg.trainer.steps:
                metrics = self.train_step()
                self.step += 1
                if cfg.trainer.val_every and self.step % cfg.trainer.val_every == 0:
                    metrics.update(self.validate_step(self.step))
                saved = self.keep_best(metrics)  # trainer.save_best: saves this step when it is the best
                logger.log(self.step, metrics)
                if self.dumped_rows:  # memrl.training.dump: this step's sample
                    logger.table(self.step, self.dumped_rows)
                history.append(metrics)
                if self.on_step is not None:
                    self.on_step(self.step, metrics)
                every = cfg.trainer.save_every
                if not saved and ((every and self.step % every == 0) or self.step == cfg.trainer.steps):
                    self.save()
        finally:
            logger.close()
            self.close()
        return history

    def close(self) -> None:
        """End the run: the runtime (the services' clients, the engine, the event loop), then the workers.
        fit() calls it; a caller that only ran setup() calls it itself."""
        try:
            self.runtime.close()
        finally:
            self.workers.close()

    def train_step(self) -> dict[str, float]:
        """One RL step: sample -> score -> advantages -> selection -> update -> sync (module docstring)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        res = self.sample_and_score()
        t1 = time.perf_counter()
        metrics = rollout_metrics(res)
        gen = metrics["rollout/generated_tokens"]
        if res.groups:
            self.advantages(res)
            per_group, selection_metrics = self.select(res.groups)
            metrics.update(selection_metrics)
            if self.gate is not None:  # no segment older than rollout.max_staleness versions trains
                from memrl.training.async_rollout import partial_metrics, stale_filter

                per_group, async_metrics = stale_filter(per_group, self.step, cfg.rollout.max_staleness)
                metrics.update(async_metrics)
                metrics.update(partial_metrics(res.groups))
            metrics.update(self.update(per_group))
            advs = [s.advantage or 0.0 for g in res.groups for t in g.trajectories for s in t.segments]
            metrics.update(_stats("advantage", advs))
            metrics["time/sync_s"] = self.sync_weights()
            metrics.update(self.sync_checked)  # rollout.sync_check: time/sync_check_s, sync/probe_max_abs_diff
            if self.gate is not None:
                metrics["time/sync_drain_s"] = self.gate_wait  # waiting for the calls in flight
                metrics["async/aborted"] = float(self.aborted)  # trajectories a sync aborted (partial=abort)
            if cfg.rollout.num_engines > 0:  # its parts: time/sync_gather_s, _send_s, _write_s, _load_s
                metrics.update({f"time/sync_{k}": v for k, v in self.weight_sync.last.items()})
            elif getattr(self, "lora_sync", None) is not None:  # lora_sync=adapter: _write_s, _load_s
                metrics.update({f"time/sync_{k}": v for k, v in self.lora_sync.last.items()})
        self.dumped_rows = self.dump.write(self.step + 1, res.groups)  # every trainer.dump_every steps
        t2 = time.perf_counter()
        metrics["time/rollout_s"] = t1 - t0  # asynchronous: the wait for the batch (the trainer idles)
        metrics["time/update_s"] = t2 - t1
        metrics["time/step_s"] = t2 - t0
        metrics["perf/rollout_tokens_per_s"] = gen / max(res.seconds if self.gate is not None else t1 - t0, 1e-9)
        metrics["perf/train_tokens_per_s"] = metrics.get("train/tokens", 0.0) / max(t2 - t1, 1e-9)
        metrics["perf/trainer_idle_share"] = (t1 - t0) / max(t2 - t0, 1e-9)
        metrics.update(self._engine_busy(t2))
        metrics["data/position"] = self.position
        return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}

    def _engine_busy(self, now: float) -> dict[str, float]:
        """perf/engine_idle_share: the share of the time since the last step's end in which the engine(s)
        generated nothing (engines that count their busy seconds: hf in process and in Ray replicas)."""
        busy_of = getattr(self.engine, "busy_seconds", None)
        if busy_of is None:
            return {}
        busy, replicas = busy_of()
        if busy < 0:  # replicas that do not count their busy time (vLLM)
            return {}
        last, self._busy_at = self._busy_at, (now, busy)
        if last is None:
            return {}
        wall = max(now - last[0], 1e-9) * max(replicas, 1)
        return {"perf/engine_busy_s": busy - last[1], "perf/engine_idle_share": max(0.0, 1 - (busy - last[1]) / wall)}

    def _open_trackers(self) -> list[Any]:
        """wandb / mlflow trackers of trainer.loggers, continuing the runs the checkpoint names."""
        import yaml

        from memrl.training.trackers import open_trackers

        t = self.cfg.trainer
        if not {"wandb", "mlflow"} & set(t.loggers):
            return []
        text = to_yaml(self.cfg)
        made = open_trackers(t.loggers, self.out, self.tracker_ids, yaml.safe_load(text), text, t.mlflow_uri)
        self.tracker_ids = {tr.name: tr.run_id for tr in made}
        return made

    def validate_step(self, step: int) -> dict[str, float]:
        """Validation of the current weights (memrl.training.validation): val/... metrics of `step`."""
        from memrl.training.validation import run_validation

        t0 = time.perf_counter()
        metrics = run_validation(self, step)
        metrics["time/val_s"] = time.perf_counter() - t0
        return metrics

    def keep_best(self, metrics: dict[str, float]) -> bool:
        """trainer.save_best: checkpoint this step as checkpoints/best when it beats the best so far."""
        from memrl.training.validation import keep_best

        return keep_best(self, self.step, metrics)

    def save(self) -> Path:
        state = {"rng": rng_state(), "step": self.step, "data_position": self.position}
        if self.producer is not None:  # asynchronous: what a resume from here discards
            state["async_in_flight"] = self.producer.in_flight(self.step)
        if self.tracker_ids:
            state["trackers"] = dict(self.tracker_ids)
        if self.best is not None:
            state["best"] = dict(self.best)
        return self.workers.save(self.ckpt_root, self.step, state, keep=self.cfg.trainer.keep_checkpoints,
                                 extra_files={"config.yaml": to_yaml(self.cfg)})

