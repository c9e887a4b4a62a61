"""Ray placement: training ranks and rollout engines as actors in placement groups.

- `connect(cfg)`: checks the Ray address is reachable, joins (or starts) Ray, and checks the cluster has
  the CPUs / GPUs the config asks for, each before any model is loaded.
- `placement_group` (and memrl.engines.ray_engines.on_bundle): the bundles the training ranks take
  (memrl.training.ranks.workers builds the ranks' actors in them: one FSDP2 group, gloo on CPU, NCCL when
  `trainer.gpus_per_worker` > 0).
- `ray_engines`: `rollout.num_engines` engine replicas (memrl.engines.ray_engines.RayEngines, each built from
  the whole `engine` config section with the replica kind and resources) placed in a group of their own or
  beside the ranks. Weights reach them through the object store, a directory, or a collective broadcast
  (memrl.training.sync.weight_sync chooses and times it).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from memrl.engines import engine_kind
from memrl.engines.ray_engines import RayEngines
from memrl.engines.registry import replica_names
from memrl.errors import UserError
from memrl.threads import worker_env
from memrl.training.config import TrainConfig

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0
"""How long a placement group may wait for its resources before the run fails."""


class PlacementError(UserError, RuntimeError):
    """The Ray cluster cannot hold what the config asks for (or cannot be reached): the config's to change, so
    the command prints it as one line (a UserError); a RuntimeError as before for callers that catch one."""


def uses_ray(cfg: TrainConfig) -> bool:
    return cfg.trainer.num_workers > 1 or cfg.rollout.num_engines > 0


def check_address(address: str, timeout: float = 5.0) -> None:
    """Fail fast, naming `ray.address`, when a "host:port" address does not accept connections."""
    if not address or address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise PlacementError(f"ray.address {address!r} is not host:port (e.g. 10.0.0.1:6379)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise PlacementError(
            f"ray.address {address}: cannot reach {host}:{port} ({e.strerror or e}); start the head node "
            "with `ray start --head` there, or leave ray.address empty for a local Ray") from e


def needs(cfg: TrainConfig) -> tuple[float, float]:
    """(CPUs, GPUs) the run reserves in Ray."""
    t, r = cfg.trainer, cfg.rollout
    workers = t.num_workers if t.num_workers > 1 else 0  # world size 1 trains in the driver
    if r.colocate:  # engines sit in the ranks' bundles and share their GPUs
        return workers * (t.cpus_per_worker + r.cpus_per_engine), workers * t.gpus_per_worker
    return (workers * t.cpus_per_worker + r.num_engines * r.cpus_per_engine,
            workers * t.gpus_per_worker + r.num_engines * r.gpus_per_engine)


def connect(cfg: TrainConfig) -> None:
    """Join the Ray cluster at `ray.address` (or start a local one) and check its resources."""
    import ray  # noqa: PLC0415

    sec = cfg.ray
    check_address(sec.address)
    if not ray.is_initialized() and not sec.address:
        check_local_cpus(cfg, sec.num_cpus or os.cpu_count() or 1)  # before Ray starts, not in a placement group
    if not ray.is_initialized():
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        if sec.address:
            kw["address"] = sec.address
        else:
            if sec.temp_dir:
                kw["_temp_dir"] = str(Path(sec.temp_dir).resolve())
            if sec.num_cpus:
                kw["num_cpus"] = sec.num_cpus
            kw["_system_config"] = {"worker_niceness": sec.worker_niceness}
        env = worker_env()  # the threads section (memrl.threads): set before a worker imports torch
        if env:
            kw["runtime_env"] = {"env_vars": env}
        ray.init(**kw)
    check_resources(cfg, ray.cluster_resources())


def replica_kind(cfg: TrainConfig) -> str:
    """The replicas' engine kind: rollout.engine, or engine.name when that is empty (vllm-cpu -> vllm)."""
    kind = cfg.rollout.engine or cfg.engine.name
    return engine_kind(kind).replica or kind


def check_resources(cfg: TrainConfig, have: dict[str, float]) -> None:
    """Raise PlacementError naming the fields when the cluster cannot place the workers and engines."""
    t, r = cfg.trainer, cfg.rollout
    kind = replica_kind(cfg)
    if kind not in replica_names():
        where = "rollout.engine" if r.engine else "engine.name (rollout.engine is empty)"
        replicas = sorted({engine_kind(n).replica for n in replica_names()})
        raise PlacementError(f"{where} {kind!r} is not {' or '.join(replicas)}")
    if r.colocate and not (1 < t.num_workers and r.num_engines <= t.num_workers):
        raise PlacementError(f"rollout.colocate needs trainer.num_workers > 1 and rollout.num_engines <= it "
                             f"(got {t.num_workers} workers, {r.num_engines} engines)")
    cpus, gpus = needs(cfg)
    got_cpu, got_gpu = float(have.get("CPU", 0)), float(have.get("GPU", 0))
    ask = (f"trainer.num_workers={t.num_workers} x (cpus {t.cpus_per_worker}, gpus {t.gpus_per_worker}) + "
           f"rollout.num_engines={r.num_engines} x (cpus {r.cpus_per_engine}, gpus {r.gpus_per_engine})")
    if gpus > 0 and got_gpu == 0:
        raise PlacementError(f"{ask} asks for {gpus:g} GPUs, but the Ray cluster has no GPU")
    if gpus > got_gpu:
        raise PlacementError(f"{ask} asks for {gpus:g} GPUs, but the Ray cluster has {got_gpu:g}")
    if cpus > got_cpu:
        raise PlacementError(f"{ask} asks for {cpus:g} CPUs, but the Ray cluster has {got_cpu:g}")


def check_local_cpus(cfg: TrainConfig, have: float) -> None:
    """PlacementError naming the fields when a Ray started on this machine (`have` CPUs: ray.num_cpus, or the
    machine's count) could not hold the CPUs the ranks and engines ask for."""
    t, r = cfg.trainer, cfg.rollout
    cpus, _ = needs(cfg)
    if cpus <= have:
        return
    sp = (f" (trainer.sequence_parallel={t.sequence_parallel} needs trainer.num_workers >= {t.sequence_parallel})"
          if t.sequence_parallel > 1 else "")
    raise PlacementError(
        f"trainer.num_workers={t.num_workers} x {t.cpus_per_worker:g} CPUs + rollout.num_engines={r.num_engines} x "
        f"{r.cpus_per_engine:g} CPUs asks for {cpus:g} CPUs{sp}, but a Ray started here has {have:g}; lower "
        "trainer.cpus_per_worker / rollout.cpus_per_engine, set ray.num_cpus to share cores, or join a cluster "
        "(ray.address)")


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    b = {"CPU": cpus}
    if gpus > 0:
        b["GPU"] = gpus
    return b


def placement_group(n: int, cpus: float, gpus: float, what: str) -> Any:
    """A PACK placement group of `n` equal bundles, ready (or PlacementError after READY_TIMEOUT_S)."""
    import ray  # noqa: PLC0415
    from ray.util.placement_group import placement_group as make_pg  # noqa: PLC0415
    from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

    pg = make_pg([_bundle(cpus, gpus) for _ in range(n)], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=READY_TIMEOUT_S)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(f"{what}: {n} bundles of {_bundle(cpus, gpus)} were not placed within "
                             f"{READY_TIMEOUT_S:g} s (cluster resources: {ray.cluster_resources()})")
    return pg


def share_gpu(cfg: TrainConfig) -> float:
    """GPUs each colocated actor takes of its bundle (a rank and an engine split it); else the rank's."""
    g = cfg.trainer.gpus_per_worker
    return g / 2 if cfg.rollout.colocate and g > 0 else g


def replica_engine_config(cfg: TrainConfig, path: str, gpus: float) -> Any:
    """The EngineConfig of every replica (EngineConfig.for_replica): the whole `engine` section, with the
    replica kind, the model `path` (the policy or the resumed checkpoint), a device from its resources, weights
    in the compute dtype unless engine.dtype says otherwise, and for vLLM rollout.gpu_memory_utilization (plus
    sleep mode when colocated on GPUs)."""
    e = cfg.engine
    dtype = e.dtype or ("bfloat16" if cfg.trainer.fsdp_bf16 else cfg.model.dtype)
    return e.for_replica(replica_kind(cfg), path, dtype, gpus, cfg.model.compute_dtype,
                         cfg.rollout.gpu_memory_utilization, replicas_sleep(cfg, gpus))


def replicas_sleep(cfg: TrainConfig, gpus: float) -> bool:
    """Whether the replicas sleep between rollouts: colocated with the ranks, on GPUs (`gpus` each), of a kind
    that sleeps (EngineKind.replica_sleeps)."""
    return cfg.rollout.colocate and engine_kind(replica_kind(cfg)).replica_sleeps and gpus > 0


def ray_engines(cfg: TrainConfig, path: str | Path, tokenizer: Any, shared_pg: Any = None) -> RayEngines:
    """`rollout.num_engines` replicas (memrl.engines.ray_engines.RayEngines) of the replica engine config
    (`path`: the policy or the resumed checkpoint): in a placement group of their own, or, colocated, engine i
    in rank i's bundle of `shared_pg` on the GPU share the rank leaves; colocated vLLM replicas on GPUs sleep
    between rollouts."""
    r = cfg.rollout
    own_pg = not (r.colocate and shared_pg is not None)
    if own_pg:
        pg = placement_group(r.num_engines, r.cpus_per_engine, r.gpus_per_engine, "rollout.num_engines")
        gpus = r.gpus_per_engine
    else:  # engine i in rank i's bundle, on the GPU share the rank leaves
        pg, gpus = shared_pg, share_gpu(cfg)
    return RayEngines(replica_engine_config(cfg, str(path), gpus), tokenizer, pg, own_pg, r.num_engines,
                      r.cpus_per_engine, gpus, replicas_sleep(cfg, gpus))
