"""The sync stage: give the rollout engine(s) the policy's current weights after an update (and once before
the first rollout of every run, fresh or resumed: an engine may hold other weights than the policy).

How the weights travel depends on the placement, chosen once when the run is assembled:
- Ray replicas (`rollout.num_engines > 0`): `rollout.weight_sync` (memrl.training.sync.weight_sync.WeightSync);
- `lora_sync=adapter` (engine.vllm / engine.openai): the adapter alone (memrl.training.sync.adapter_sync);
- in process: the state dict (a no-op for an hf engine sharing the trained module);
- a server (`engine=openai`): a saved HuggingFace directory it reloads (`engine.openai.sync_dir`).

With `rollout.sync_check` the probe of memrl.training.sync.sync_check then proves the engine serves them.
Asynchronous training: the producer's gate (memrl.engines.versioned) is closed around the sync (no call
starts; the calls in flight finish on the old weights) and reopened on the new policy version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memrl.engines.registry import engine_kind
from memrl.training.config import TrainConfig
from memrl.training.sync import adapter_sync
from memrl.training.sync.sync_check import check_sync
from memrl.training.update.lora import engine_weights, save_engine_dir


def _transfer(cfg: TrainConfig, workers: Any, engine: Any, tokenizer: Any, out: Path,
              weight_sync: Any) -> tuple[Callable[[], float], Any]:
    """(one transfer -> its seconds, the object whose `last` holds the transfer's parts, or None)."""
    if cfg.rollout.num_engines > 0:
        return weight_sync, weight_sync
    e = cfg.engine
    kind = engine_kind(e.name)
    if adapter_sync.mode(cfg) == "adapter":
        root = Path(kind.sync_dir(e) or out / "engine_weights") if kind.weights_by_directory else out / adapter_sync.ADAPTER_DIR
        lora = adapter_sync.AdapterSync(workers.model, engine, root)
        return lora, lora

    def in_process() -> float:
        t0 = time.perf_counter()
        if not kind.weights_by_directory:
            engine.update_weights(engine_weights(workers, engine))  # LoRA: merged weights
        else:
            d = Path(kind.sync_dir(e) or out / "engine_weights")
            save_engine_dir(workers.model, tokenizer, d)  # LoRA: the merged HuggingFace directory
            engine.update_weights(str(d.resolve()))
        return time.perf_counter() - t0

    return in_process, None


class EngineSync:
    """`sync(version, when)` -> the sync's metrics: time/sync_s, the transfer's parts (time/sync_<part>_s:
    gather, send, write, load, as the transfer reports them), the probe's (time/sync_check_s,
    sync/probe_max_abs_diff) and, asynchronous, time/sync_drain_s and async/aborted."""

    def __init__(self, cfg: TrainConfig, workers: Any, engine: Any, tokenizer: Any, runtime: Any, out: Path,
                 gate: Any = None, weight_sync: Any = None) -> None:
        self.cfg, self.workers, self.engine, self.tokenizer, self.runtime = cfg, workers, engine, tokenizer, runtime
        self.gate = gate
        self.transfer, self.parts = _transfer(cfg, workers, engine, tokenizer, out, weight_sync)

    def __call__(self, version: int, when: str) -> dict[str, float]:
        """Sync; the engines then serve policy version `version` (the weights after that many updates)."""
        metrics: dict[str, float] = {}
        if self.gate is not None:
            t0 = time.perf_counter()
            self.runtime.run(self.gate.pause())
            metrics["time/sync_drain_s"] = time.perf_counter() - t0  # waiting for the calls in flight
        aborted = 0
        try:
            metrics["time/sync_s"] = self.transfer()
            metrics.update(check_sync(self.cfg, when, self.tokenizer, self.engine, self.runtime, self.workers))
        finally:
            if self.gate is not None:
                aborted = self.runtime.run(self.gate.resume(version))
        if self.gate is not None:
            metrics["async/aborted"] = float(aborted)  # trajectories a sync aborted (partial=abort)
        if self.parts is not None:
            metrics.update({f"time/sync_{k}": v for k, v in self.parts.last.items()})
        return metrics
