"""Rollout engine replicas as Ray actors behind one Engine (training with rollout.num_engines >= 1).

`RayEngines` holds `num_engines` actors in a placement group, each serving an engine built from one
EngineConfig (memrl.engines.build_engine); each request goes to the replica with the fewest outstanding
requests, and the requests of one event-loop turn travel to a replica in one call. Weights reach them
through the object store (one put, every replica reads it), a directory, or a collective broadcast
(memrl.engines.weight_transfer). Where the actors go (the placement group, the GPU share) is the
trainer's: memrl.training.ranks.placement.ray_engines builds one from a training config.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from memrl.engines import build_engine
from memrl.engines.base import Capabilities, capabilities
from memrl.threads import apply_inherited


def on_bundle(pg: Any, i: int, cpus: float, gpus: float) -> dict[str, Any]:
    """Actor options that place an actor of `cpus` / `gpus` in bundle `i` of the placement group `pg`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: PLC0415

    return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=i)}


class _EngineActor:
    """An HFEngine or VLLMEngine (memrl.engines.build_engine of a whole EngineConfig) in an async Ray
    actor: concurrent generate calls batch inside it."""

    def __init__(self, engine_cfg: Any) -> None:
        apply_inherited()  # the driver's threads section (memrl.threads); intra_op's default: this actor's CPUs
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

    def __init__(self, engine_cfg: Any, tokenizer: Any, pg: Any, own_pg: bool, num_engines: int, cpus: float,
                 gpus: float, sleeps: bool = False) -> None:
        """`num_engines` actors, actor i in bundle i of the placement group `pg` with `cpus` / `gpus` each,
        every one building `engine_cfg` (an EngineConfig); `own_pg`: `pg` is removed with them. `sleeps`:
        the replicas sleep before an update and wake for the next rollout (colocated on the trainer's GPUs)."""
        import ray  # noqa: PLC0415

        self.tokenizer = tokenizer
        self.pg, self.own_pg = pg, own_pg
        self.kind = engine_cfg.name
        self.gpus = gpus
        self.sleeps = sleeps
        self.asleep = False
        cls = ray.remote(_EngineActor)
        self.actors = [cls.options(max_concurrency=4096, **on_bundle(self.pg, i, cpus, gpus)).remote(engine_cfg)
                       for i in range(num_engines)]
        try:
            ray.get([a.__ray_ready__.remote() for a in self.actors])
        except BaseException:
            for a in self.actors:
                ray.kill(a)
            if self.own_pg:
                from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

                remove_placement_group(self.pg)
            raise
        self.outstanding = [0] * num_engines
        self.served = [0] * num_engines
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
        """Each replica's per-parameter sums (_EngineActor.param_sums)."""
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
