"""Assembly: a training run's parts, built once from its config before the loop runs.

`assemble(cfg)` checks the config (every field, then what spans sections), reads the data, loads or
resumes the policy's workers (model, KL reference, optimizer, scheduler), builds the rollout engine (in
process, a server client, or Ray replicas with their weight sync), the run's RolloutRuntime (one event
loop with the engine and the services), the task stream, the trajectory dump and the sync stage, and
returns them as `RunParts`. `memrl.training.trainer.Trainer` takes the parts and only runs the loop.

Tests build parts through the same function: `assemble(cfg, workers=..., engine=..., tokenizer=...,
tasks=...)` uses the given parts instead of loading them (a scripted engine, stub workers).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from memrl.algorithms.process_rewards import FOLD_PROCESS_REWARDS
from memrl.config import ConfigError, check_config, check_shared_fields
from memrl.data.io import load_tasks
from memrl.data.mixture import balanced_batches
from memrl.data.synthetic import task_stream as synthetic_stream
from memrl.engines import build_engine
from memrl.engines.base import SamplingParams
from memrl.engines.registry import engine_kind
from memrl.engines.versioned import VersionedEngine
from memrl.errors import UserError, model_dir, writable_dir
from memrl.model_files import weights_digest
from memrl.model_open import model_config
from memrl.runtime import RolloutRuntime
from memrl.services.registry import retriever_problem
from memrl.training.checkpoints.checkpoint import clean_stale, resume_point, set_rng_state
from memrl.training.checkpoints.run_dir import check_resumed_config
from memrl.training.config import TrainConfig
from memrl.training.monitor.dump import TrajectoryDump
from memrl.training.ranks.placement import connect, ray_engines, uses_ray
from memrl.training.ranks.workers import build_workers
from memrl.training.step import validation as val
from memrl.training.sync import adapter_sync
from memrl.training.sync.engine_sync import EngineSync
from memrl.training.sync.weight_sync import WeightSync
from memrl.training.update.lora import base_source, enabled, engine_policy
from memrl.training.update.routing import EngineRouting
from memrl.types import Task
from memrl.workflows import parse_workflow
from memrl.workflows.templates import check_thinking_switch

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the config, checked before any work
def check_writable(out_dir: str | os.PathLike, key: str = "out_dir") -> Path:
    """Create `out_dir` and prove we can write in it, before any expensive work starts."""
    return writable_dir(out_dir, key)


def workflow_config(cfg: TrainConfig) -> tuple[Any, Any]:
    """(WorkflowSpec, typed workflow config) from the `workflow` section and the spec's train_defaults;
    sampling runs at algorithm.temperature, because the trainer recomputes logprobs at that temperature."""
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
    memrl.training.step.validation.check); returns the parsed workflow (spec, config), which `assemble` takes
    so it is parsed once."""
    check_config(cfg)
    cfg.check()
    val.check(cfg)
    spec, wf = workflow_config(cfg)
    if cfg.algorithm.model_reward == "infomem" and spec.memory_prompts is None:
        raise ConfigError(f"algorithm.model_reward=infomem scores a final memory, which workflow={spec.name} does not "
                          "keep (WorkflowSpec.memory_prompts; memagent has one)")
    if cfg.algorithm.name == "rememr1" and spec.step_rewards is None:
        raise ConfigError(f"algorithm.name=rememr1 needs step rewards, which workflow={spec.name} does not give "
                          "(WorkflowSpec.step_rewards: memagent, rememr1 and infmem do); use grpo, rloo or dcpo there")
    check_estimator_fits_workflow(cfg, spec)
    return spec, wf


def check_estimator_fits_workflow(cfg: TrainConfig, spec: Any) -> None:
    """An estimator whose terms the workflow cannot feed is refused, not run as another one: foldgrpo's
    built-in process rewards read fold's branch rows (WorkflowSpec.branches); on any other workflow they are
    all 0 and foldgrpo is plain GRPO."""
    terms = list(cfg.algorithm.foldgrpo.process_rewards)
    if cfg.algorithm.name == "foldgrpo" and not spec.branches and terms and set(terms) <= set(FOLD_PROCESS_REWARDS):
        raise ConfigError(f"algorithm.name=foldgrpo on workflow={spec.name}: its process rewards ({', '.join(terms)}) "
                          "read the branches workflow=fold records, and this workflow records none, so it would "
                          "train as plain GRPO; use workflow=fold or algorithm.name=grpo")


def check_task_kinds(cfg: TrainConfig, tasks: list[Task] | None) -> None:
    """Every training task has the meta key that algorithm.grpo.std_over=task or data.sampling=task_balanced
    read (for synthetic data: the stream's first task, all have the same keys); UserError naming the setting,
    the task and the file otherwise, when the tasks are read, before any model loads."""
    a = cfg.algorithm
    keys = []
    if a.name == "grpo" and a.grpo.norm_by_std and a.grpo.std_over == "task":
        keys.append(("algorithm.grpo.std_over=task", "algorithm.grpo.task_key", a.grpo.task_key))
    if cfg.data.sampling == "task_balanced":
        keys.append(("data.sampling=task_balanced", "data.task_key", cfg.data.task_key))
    if not keys:
        return
    sample = tasks if tasks is not None else [next(synthetic_stream(cfg.data.synthetic, cfg.data.seed, 0))]
    where = f"of {cfg.data.path}" if tasks is not None else "of the synthetic stream (data.name=synthetic)"
    for setting, key_field, key in keys:
        missing = next((t for t in sample if key not in t.meta), None)
        if missing is not None:
            has = ", ".join(sorted(map(str, missing.meta))) or "none"
            raise UserError(f"{setting} reads each task's meta[{key!r}] ({key_field}), but task {missing.task_id} "
                            f"{where} has none (its meta keys: {has})")


def algorithm_options(cfg: TrainConfig) -> tuple[Any, Any]:
    """The options of the chosen advantage estimator and loss, filled from algorithm.* (their registered
    options dataclasses; None for one registered without): `AlgorithmSection.options`."""
    return cfg.algorithm.options()


def file_tasks(cfg: TrainConfig) -> list[Task] | None:
    """The tasks of `data.path` (None for synthetic data), read before any model loads, so a bad file
    (duplicate ids, unscorable rows) fails in seconds."""
    if cfg.data.name == "synthetic":
        return None
    tasks = load_tasks(cfg.data.path, docs_from=cfg.data.docs_from or None)
    if not tasks:
        raise UserError(f"data.path {cfg.data.path} holds no tasks")
    return tasks


def task_stream(cfg: TrainConfig, start: int, tasks: list[Task] | None = None) -> Iterator[Task]:
    """The training tasks from position `start` on (synthetic: endless; file: epochs of `tasks`, read from
    data.path when not given, each in a new seeded order, or in the file's order with data.shuffle=false)."""
    if cfg.data.name == "synthetic":
        return synthetic_stream(cfg.data.synthetic, cfg.data.seed, start)
    if tasks is None:
        tasks = file_tasks(cfg)
    assert tasks is not None

    if cfg.data.sampling == "task_balanced":
        return itertools.islice(_balanced(cfg, tasks), start, None)

    def epochs() -> Iterator[Task]:
        for epoch in itertools.count():
            order = list(range(len(tasks)))
            if cfg.data.shuffle:  # False: the file's order every epoch (verl's SequentialSampler)
                random.Random(f"{cfg.data.seed}:{epoch}").shuffle(order)
            for i in order:
                t = tasks[i]
                yield Task(f"{t.task_id}@e{epoch}", t.question, t.context, t.answers, t.meta)

    return itertools.islice(epochs(), start, None)


def _balanced(cfg: TrainConfig, tasks: list[Task]) -> Iterator[Task]:
    """data.sampling=task_balanced (memrl.data.mixture): batches of trainer.batch_size tasks with as many of
    each kind (Task.meta[data.task_key]) as the sampler gives; ids get "@b<batch>", unique over the run."""
    key = cfg.data.task_key
    missing = next((t.task_id for t in tasks if key not in t.meta), None)
    if missing is not None:
        raise UserError(f"data.sampling=task_balanced: task {missing} of {cfg.data.path} has no {key!r} "
                        "(data.task_key names the task kind)")
    kinds = [str(t.meta[key]) for t in tasks]
    for b, batch in enumerate(balanced_batches(kinds, cfg.trainer.batch_size, cfg.data.seed, cfg.data.shuffle)):
        for i in batch:
            t = tasks[i]
            yield Task(f"{t.task_id}@b{b}", t.question, t.context, t.answers, t.meta)


# ---------------------------------------------------------------- the parts
@dataclass
class TrainState:
    """The loop's state that a checkpoint keeps (besides weights, optimizer and RNG)."""

    step: int = 0
    """RL steps done."""
    position: int = 0
    """Tasks drawn from the task stream so far (a resume continues there)."""
    tracker_ids: dict[str, str] = field(default_factory=dict)
    """wandb / mlflow run ids (memrl.training.monitor.trackers), so a resumed run continues them."""
    best: dict[str, Any] | None = None
    """trainer.save_best: {"metric", "value", "step"} of the best step so far."""
    base_weights: str | None = None
    """LoRA: the SHA-256 of model.path's weight files (memrl.model_files.weights_digest), the base the
    checkpoints' adapters were trained on; `--resume` refuses other weights."""
    health: dict[str, Any] | None = None
    """memrl.training.monitor.health.HealthMonitor.saved() as the checkpoint holds it (None: a fresh run)."""

    def saved(self, async_in_flight: int | None = None) -> dict[str, Any]:
        """The driver state a checkpoint holds (memrl.training.checkpoints.checkpoint), without the RNG."""
        out: dict[str, Any] = {"step": self.step, "data_position": self.position}
        if async_in_flight is not None:  # asynchronous: what a resume from here discards
            out["async_in_flight"] = async_in_flight
        if self.tracker_ids:
            out["trackers"] = dict(self.tracker_ids)
        if self.best is not None:
            out["best"] = dict(self.best)
        if self.base_weights is not None:
            out["base_weights_sha256"] = self.base_weights
        if self.health is not None:
            out["health"] = self.health
        return out


@dataclass
class RunParts:
    """Everything a training run needs, built by `assemble`; `close()` ends what it started."""

    cfg: TrainConfig
    spec: Any
    """The workflow's memrl.workflows.WorkflowSpec."""
    wf_cfg: Any
    """The workflow's typed config (training defaults applied)."""
    adv_options: Any
    loss_options: Any
    out: Path
    tasks: list[Task] | None
    """data.path's tasks (None for synthetic data)."""
    tokenizer: Any
    workers: Any
    """The policy's ranks (memrl.training.ranks.worker_group.WorkerGroup)."""
    engine: Any
    runtime: RolloutRuntime
    gate: VersionedEngine | None
    """Asynchronous training (rollout.max_staleness > 0): the gate a weight sync closes."""
    stream: Iterator[Task]
    dump: TrajectoryDump
    sync: EngineSync
    state: TrainState

    @property
    def ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def close(self) -> None:
        """The runtime (services' clients, the engine, the event loop), then the workers."""
        try:
            self.runtime.close()
        finally:
            self.workers.close()


def _resumed_state(cfg: TrainConfig, point: Any) -> TrainState:
    state = point.state
    set_rng_state(state["rng"])
    out = TrainState(int(state["step"]), int(state["data_position"]), dict(state.get("trackers") or {}),
                     state.get("best"), health=state.get("health"))
    log.warning("resumed from %s (step %d, data position %d)", point.path, out.step, out.position)
    if state.get("async_in_flight"):
        log.warning("asynchronous run: the %d rollout batch(es) sampled ahead of step %d when it was saved "
                    "were discarded; their tasks (from data position %d) are sampled again",
                    state["async_in_flight"], out.step, out.position)
    return out


def _check_base_weights(cfg: TrainConfig, saved: dict[str, Any] | None) -> str | None:
    """LoRA: the digest of model.path's weights; a resumed checkpoint that recorded another is refused (its
    adapter was trained on other base weights, placed at the same path or not). None: no weight files."""
    digest = weights_digest(cfg.model.path) if Path(cfg.model.path).is_dir() else None
    was = (saved or {}).get("base_weights_sha256")
    if was is not None and digest != was:
        raise ConfigError(f"--resume: model.path={cfg.model.path} holds other base weights than the LoRA run was "
                          f"trained on (SHA-256 of its weight files {str(digest)[:16]}..., the checkpoint's "
                          f"{str(was)[:16]}...); put the run's base weights back or train into a new out_dir")
    return digest


def _engine(cfg: TrainConfig, src: str, workers: Any, tokenizer: Any) -> Any:
    """The in-process or server engine; one that loads weights itself starts from `src` (the resumed
    checkpoint)."""
    sec = cfg.engine
    kind = engine_kind(sec.name)
    if not kind.serves_policy and not sec.model:
        sec = dataclasses.replace(sec, model=src)
    if kind.for_policy is not None:  # hf with model.compute_dtype=bfloat16: a bfloat16 copy of the policy
        sec = kind.for_policy(sec, cfg.model.compute_dtype)
    policy = getattr(workers, "model", None)  # None for Ray ranks
    if kind.serves_policy and policy is not None:
        shares = kind.shares_policy(sec) if kind.shares_policy is not None else False
        policy = engine_policy(policy, shares)  # LoRA, a copy: a plain merged module
    lora_rank = cfg.model.lora.rank if adapter_sync.mode(cfg) == "adapter" else 0
    return build_engine(sec, policy=policy, tokenizer=tokenizer, lora_rank=lora_rank)


MOE_ROUTED_TYPES = ("qwen3_moe",)
"""Model types whose routers routing replay records and replays (memrl.training.update.routing: Qwen3-MoE's)."""


def check_policy_model(cfg: TrainConfig, wf_cfg: Any, config: Any, tokenizer: Any, where: str) -> None:
    """The RL config's needs of the policy model, from its transformers config and its tokenizer (chat template)
    alone, before any weights load: routing replay needs a model of MOE_ROUTED_TYPES, trainer.router_aux_loss_coef
    a mixture-of-experts config (output_router_logits), workflow.enable_thinking a chat template that reads it
    (check_thinking_switch). A ConfigError naming the setting and `where` (the model). `memrl train` runs it on
    model.path; `memrl demo` on the model its first stage will build, before that stage starts."""
    model_type = getattr(config, "model_type", type(config).__name__)
    replay = cfg.algorithm.routing_replay
    if replay != "none" and model_type not in MOE_ROUTED_TYPES:
        raise ConfigError(f"algorithm.routing_replay={replay} needs a mixture-of-experts model with Qwen3-MoE routers "
                          f"(model_type {' or '.join(MOE_ROUTED_TYPES)}); {where} is {model_type}")
    coef = cfg.trainer.router_aux_loss_coef
    if coef > 0 and not hasattr(config, "output_router_logits"):
        raise ConfigError(f"trainer.router_aux_loss_coef={coef} needs a mixture-of-experts model (a config with "
                          f"output_router_logits, e.g. qwen3_moe); {where} is {model_type}")
    check_thinking_switch(tokenizer, getattr(wf_cfg, "enable_thinking", None), where)


def assemble(cfg: TrainConfig, resume: bool = False, workflow: tuple[Any, Any] | None = None, *,
             workers: Any = None, engine: Any = None, tokenizer: Any = None,
             tasks: list[Task] | None = None) -> RunParts:
    """The run's parts from `cfg` (resuming from the latest checkpoint in out_dir/checkpoints with
    `resume`). `workflow`: the (spec, config) `validate(cfg)` returned, when the caller validated already.
    Given `workers` / `engine` / `tokenizer` / `tasks` are used as they are (tests: stub workers and a
    scripted engine; nothing is loaded for them, and a resume needs the loaded workers)."""
    spec, wf_cfg = workflow if workflow is not None else validate(cfg)
    problem = retriever_problem(wf_cfg, spec.name)  # a run's, checked before any model loads (a preset's
    if problem:  # own check, validate, leaves the retriever to the user who runs it)
        raise ConfigError(problem)
    adv_options, loss_options = algorithm_options(cfg)
    out = check_writable(cfg.out_dir)
    if workers is None:
        model_dir(cfg.model.path, "model.path")  # before any work, not deep inside transformers
        model_config(cfg.model.path, "model.path")  # a model_type or config transformers refuses, too
    elif resume:
        raise ValueError("assemble: resume=True loads the workers from the checkpoint; do not pass workers")
    tasks = tasks if tasks is not None else file_tasks(cfg)  # data errors too, before any model loads
    check_task_kinds(cfg, tasks)
    root = out / "checkpoints"
    state, start, src, base = TrainState(), None, str(cfg.model.path), None
    if workers is None:
        clean_stale(root)
        point = resume_point(root) if resume else None
        if resume and point is None:
            log.warning("--resume: no checkpoint in %s; starting from step 0", root)
        if point is not None:
            check_resumed_config(cfg, point.path)  # another data.path or batch size must not continue silently
        if enabled(cfg.model):  # LoRA: the base weights by content, before the model loads
            base = _check_base_weights(cfg, point.state if point is not None else None)
        start = point.path if point is not None else None
        src = base_source(cfg.model, start)  # LoRA: engines start from the base (a checkpoint holds the adapter)
        if uses_ray(cfg):
            connect(cfg)  # address and resources checked before any model is loaded
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(src)
        check_policy_model(cfg, wf_cfg, model_config(src, "model.path"), tokenizer, f"model.path {src}")
        workers = build_workers(cfg, start)  # model, KL reference, optimizer, scheduler (resumed)
    random.seed(cfg.trainer.seed)
    torch.manual_seed(cfg.trainer.seed)
    if start is not None:
        state = _resumed_state(cfg, point)
    state.base_weights = base
    runtime = None
    try:
        weight_sync = None
        if engine is None and cfg.rollout.num_engines > 0:
            engine = ray_engines(cfg, src, tokenizer, workers.pg)
            weight_sync = WeightSync(cfg, workers, engine, out)
        elif engine is None:
            engine = _engine(cfg, src, workers, tokenizer)
            if cfg.algorithm.routing_replay == "r3":  # the hf engine records every fed token's experts
                engine.routing = EngineRouting(engine.model)
        r = cfg.rollout
        runtime = RolloutRuntime(engine, spec, wf_cfg, concurrency=cfg.trainer.concurrency,
                                 background=r.max_staleness > 0)
        gate = None
        if r.max_staleness > 0:  # the producer samples through the gate a weight sync closes
            gate = VersionedEngine(engine, state.step, abort=r.partial == "abort", max_aborts=r.partial_max_aborts)
        return RunParts(
            cfg=cfg, spec=spec, wf_cfg=wf_cfg, adv_options=adv_options, loss_options=loss_options, out=out,
            tasks=tasks, tokenizer=tokenizer, workers=workers, engine=engine, runtime=runtime, gate=gate,
            stream=task_stream(cfg, state.position, tasks),
            dump=TrajectoryDump(out, cfg.trainer, str(cfg.workflow["name"]), tokenizer),
            sync=EngineSync(cfg, workers, engine, tokenizer, runtime, out, gate, weight_sync), state=state)
    except BaseException:
        if runtime is not None:
            runtime.close()
        workers.close()  # Ray actors and placement groups are not left behind
        raise
