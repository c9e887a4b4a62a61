"""Ray placement: training ranks and rollout engines as actors in placement groups.

- `connect(cfg)`: checks the Ray address is reachable, joins (or starts) Ray, and checks the cluster has
  the CPUs / GPUs the config asks for, each before any model is loaded.
- `placement_group` / `on_bundle`: the bundles the training ranks take (memrl.training.workers builds
  the ranks' actors in them: one FSDP2 group, gloo on CPU, NCCL when `trainer.gpus_per_worker` > 0).
- `RayEngines`: `rollout.num_engines` engines (transformers HFEngine or VLLMEngine, each built from the
  whole `engine` config section) in actors, each request sent to the replica with the fewest outstanding
  requests. Weights reach them through the object store (one put, every engine reads it), a directory,
  or a collective broadcast (memrl.training.weight_sync chooses and times it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from memrl.engines import build_engine, engine_kind
from memrl.engines.base import Capabilities, capabilities
from memrl.engines.registry import replica_names
from memrl.errors import UserError
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


def on_bundle(pg: Any, i: int, cpus: float, gpus: float) -> dict[str, Any]:
    """Actor options that place an actor of `cpus` / `gpus` in bundle `i` of the placement group `pg`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: PLC0415

    return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=i)}


def replica_engine_config(cfg: TrainConfig, path: str, gpus: float) -> Any:
    """The EngineConfig of every replica: the whole `engine` section, with the replica kind, the model
    `path` (the policy or the resumed checkpoint), a device from its resources, weights in the compute
    dtype unless engine.dtype says otherwise, and for vLLM rollout.gpu_memory_utilization (plus sleep
    mode when colocated on GPUs)."""
    e, r = cfg.engine, cfg.rollout
    kind = replica_kind(cfg)
    dtype = e.dtype or ("bfloat16" if cfg.trainer.fsdp_bf16 else cfg.model.dtype)
    hf = replace(e.hf, device="cuda" if gpus > 0 else "cpu", share_weights=False,
                 compute_dtype=e.hf.compute_dtype or cfg.model.compute_dtype)
    vllm = replace(e.vllm, gpu_memory_utilization=r.gpu_memory_utilization,
                   enable_sleep_mode=e.vllm.enable_sleep_mode or (r.colocate and engine_kind(kind).replica_sleeps and gpus > 0))
    return replace(e, name=kind, model=path, dtype=dtype, hf=hf, vllm=vllm)


# ---------------------------------------------------------------------------- rollout engines
class _EngineActor:
    """An HFEngine or VLLMEngine (memrl.engines.build_engine of a whole EngineConfig) in an async Ray
    actor: concurrent generate calls batch inside it."""

    def __init__(self, engine_cfg: Any) -> None:
        self.engine = build_engine(engine_cfg)
        self.engine_cfg = engine_cfg

    def settings(self) -> Any:
        """The EngineConfig this replica was built from."""
        return self.engine_cfg

    def transfer_members(self) -> int:
        return int(self.engine.transfer_members) if capabilities(self.engine).weight_transfer else 1

    async def sleep(self) -> None:
        await asyncio.to_thread(self.engine.sleep, 1)

    async def wake_up(self) -> None:
        await asyncio.to_thread(self.engine.wake_up)

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        return await self.engine.generate(prompt_ids, sampling)

    async def generate_many(self, requests: list[tuple[list[int], Any]]) -> list[Any]:
        """A wave of requests in one call, submitted to the engine in one event-loop turn (one wave of a
        deterministic hf engine, as in process); a failed request comes back as its exception."""
        return await asyncio.gather(*(self.engine.generate(p, s) for p, s in requests), return_exceptions=True)

    async def update_weights(self, box: list[Any] | str) -> float:
        """New weights from an object-store reference (in a list, so Ray hands the reference on) or a
        directory; returns the seconds it took here."""
        t0 = time.perf_counter()
        state = box if isinstance(box, str) else await box[0]
        await asyncio.to_thread(self.engine.update_weights, state)
        return time.perf_counter() - t0

    async def init_weight_transfer(self, spec: Any, first_rank: int) -> None:
        await asyncio.to_thread(self.engine.init_weight_transfer, spec, first_rank)

    async def receive_weights(self) -> float:
        t0 = time.perf_counter()
        await asyncio.to_thread(self.engine.receive_weights)
        return time.perf_counter() - t0

    def busy_seconds(self) -> float:
        """Seconds the engine has spent generating (engines that count them, else -1)."""
        if not capabilities(self.engine).busy_accounting:
            return -1.0
        return float(self.engine.busy_seconds()[0])

    def param_sums(self) -> dict[str, float]:
        """Per-parameter float64 sums of the served weights (to check a sync landed; hf replicas)."""
        return {k: float(v.double().sum()) for k, v in self.engine.model.state_dict().items()}

    async def close(self) -> None:
        await self.engine.close()


class RayEngines:
    """`rollout.num_engines` engine replicas behind one Engine: least-outstanding-requests balancing."""

    capabilities = Capabilities(weight_transfer=True, busy_accounting=True)

    def __init__(self, cfg: TrainConfig, path: str | Path, tokenizer: Any, shared_pg: Any = None) -> None:
        import ray  # noqa: PLC0415

        r = cfg.rollout
        self.tokenizer = tokenizer
        self.own_pg = not (r.colocate and shared_pg is not None)
        if self.own_pg:
            self.pg = placement_group(r.num_engines, r.cpus_per_engine, r.gpus_per_engine, "rollout.num_engines")
            gpus = r.gpus_per_engine
        else:  # engine i in rank i's bundle, on the GPU share the rank leaves
            self.pg, gpus = shared_pg, share_gpu(cfg)
        self.kind = replica_kind(cfg)
        self.gpus = gpus
        self.sleeps = r.colocate and engine_kind(self.kind).replica_sleeps and gpus > 0
        self.asleep = False
        cls = ray.remote(_EngineActor)
        ecfg = replica_engine_config(cfg, str(path), gpus)
        self.actors = [cls.options(max_concurrency=4096, **on_bundle(self.pg, i, r.cpus_per_engine, gpus)).remote(ecfg)
                       for i in range(r.num_engines)]
        try:
            ray.get([a.__ray_ready__.remote() for a in self.actors])
        except BaseException:
            for a in self.actors:
                ray.kill(a)
            if self.own_pg:
                from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

                remove_placement_group(self.pg)
            raise
        self.outstanding = [0] * r.num_engines
        self.served = [0] * r.num_engines
        self._waves: dict[asyncio.AbstractEventLoop, list[tuple[int, list[int], Any, asyncio.Future[Any]]]] = {}
        """Per event loop, the requests of its current turn (sent together at the turn's end)."""
        self._sending: set[asyncio.Task[None]] = set()
        self.last_load_s = 0.0

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        """Each request goes to the replica with the fewest outstanding; the requests of one event-loop
        turn travel to each replica in one actor call (`_EngineActor.generate_many`): one RPC per wave, not
        per request, and a deterministic hf replica decodes the wave together, as the in-process engine does."""
        i = min(range(len(self.actors)), key=lambda k: (self.outstanding[k], k))
        self.outstanding[i] += 1
        self.served[i] += 1
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        wave = self._waves.setdefault(loop, [])  # per loop: a caller on another thread has its own waves
        if not wave:
            loop.call_soon(self._send_wave, loop)
        wave.append((i, list(prompt_ids), sampling, fut))
        try:
            return await fut
        finally:
            self.outstanding[i] -= 1

    def _send_wave(self, loop: asyncio.AbstractEventLoop) -> None:
        wave = self._waves.pop(loop, [])
        for i in sorted({w[0] for w in wave}):
            mine = [w for w in wave if w[0] == i]
            task = asyncio.ensure_future(self._deliver(
                self.actors[i].generate_many.remote([(p, s) for _, p, s, _ in mine]), [f for *_, f in mine]))
            self._sending.add(task)  # a reference until it is done (the loop keeps only weak ones)
            task.add_done_callback(self._sending.discard)

    @staticmethod
    async def _deliver(call: Any, futures: list[asyncio.Future[Any]]) -> None:
        try:
            results = await call
        except BaseException as e:  # noqa: BLE001 - the actor call failed: every request of the wave fails
            results = [e] * len(futures)
        for f, r in zip(futures, results, strict=True):
            if f.done():
                continue
            if isinstance(r, BaseException):
                f.set_exception(r)
            else:
                f.set_result(r)

    def busy_seconds(self) -> tuple[float, int]:
        """(seconds all replicas have spent generating, replicas); (-1, n) when they do not count them."""
        import ray  # noqa: PLC0415

        got = ray.get([a.busy_seconds.remote() for a in self.actors])
        return (sum(got) if min(got) >= 0 else -1.0), len(got)

    def param_sums(self) -> list[dict[str, float]]:
        """Each replica's per-parameter sums (memrl.training.placement._EngineActor.param_sums)."""
        import ray  # noqa: PLC0415

        return ray.get([a.param_sums.remote() for a in self.actors])

    def release_memory(self) -> None:
        """Before the update: colocated vLLM replicas sleep (free KV cache, offload weights)."""
        import ray  # noqa: PLC0415

        if self.sleeps and not self.asleep:
            ray.get([a.sleep.remote() for a in self.actors])
            self.asleep = True

    def _wake(self) -> None:
        import ray  # noqa: PLC0415

        if self.asleep:
            ray.get([a.wake_up.remote() for a in self.actors])
            self.asleep = False

    def update_weights(self, weights: Any) -> None:
        """New weights on every replica: an object-store reference, a state dict (put once), or a
        directory every replica reads."""
        import ray  # noqa: PLC0415

        self._wake()
        if isinstance(weights, str | Path):
            box: Any = str(weights)
        else:
            box = [weights if isinstance(weights, ray.ObjectRef) else ray.put(dict(weights))]
        self.last_load_s = max(ray.get([a.update_weights.remote(box) for a in self.actors]))

    def settings(self) -> list[Any]:
        """Each replica's EngineConfig."""
        import ray  # noqa: PLC0415

        return ray.get([a.settings.remote() for a in self.actors])

    @property
    def transfer_members(self) -> int:
        """Processes the replicas add to a weight-transfer group."""
        import ray  # noqa: PLC0415

        if not hasattr(self, "_members"):
            self._members = ray.get([a.transfer_members.remote() for a in self.actors])
        return sum(self._members)

    def init_weight_transfer(self, spec: Any, first_rank: int) -> None:
        """Every replica joins the broadcast group (ranks first_rank..; blocks until all joined)."""
        import ray  # noqa: PLC0415

        self._wake()
        assert self.transfer_members > 0  # asks each replica once
        ranks = [first_rank]
        for m in self._members:
            ranks.append(ranks[-1] + m)
        ray.get([a.init_weight_transfer.remote(spec, ranks[i]) for i, a in enumerate(self.actors)])

    def receive_weights(self) -> None:
        """Every replica receives the trainer's broadcast (the trainer sends meanwhile)."""
        import ray  # noqa: PLC0415

        self._wake()
        self.last_load_s = max(ray.get([a.receive_weights.remote() for a in self.actors]))

    async def close(self) -> None:
        import ray  # noqa: PLC0415
        from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

        try:
            await asyncio.gather(*[a.close.remote() for a in self.actors])
        finally:
            for a in self.actors:
                ray.kill(a)
            if self.own_pg:
                remove_placement_group(self.pg)
