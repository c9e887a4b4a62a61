"""Weight sync from the trainer's ranks to the Ray engine replicas after each update
(`rollout.weight_sync`):

- object_store: the gathered state dict is put once in Ray's object store; every replica reads it.
- directory: rank 0 writes model.safetensors to `rollout.sync_dir`; every replica reads the file (vLLM
  workers read it themselves: nothing goes through vLLM's RPC).
- broadcast: trainer rank 0 and every replica process form a group of their own (memrl.engines.
  weight_transfer; nccl or gloo) once; each sync is one announced, bucketed broadcast that the replicas
  stream into their models (vLLM: `load_weights` in each worker).

`auto` picks broadcast for vLLM replicas with GPUs of their own, directory for vLLM replicas without
(CPU, or colocated on the ranks' GPUs: NCCL cannot pair two ranks on one device), object_store for
transformers replicas. The sender and the receivers run at the same time (two threads here; each
side's Ray calls block in its own thread).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from memrl.config import ConfigError
from memrl.engines.registry import engine_kind
from memrl.engines.weight_transfer import TransferSpec
from memrl.training.config import TrainConfig
from memrl.training.ranks.placement import replica_kind, share_gpu
from memrl.training.ranks.worker_group import WorkerGroup

MODES = ("object_store", "broadcast", "directory")


def resolve_mode(cfg: TrainConfig) -> str:
    """rollout.weight_sync with `auto` resolved (see the module docstring)."""
    r = cfg.rollout
    if r.weight_sync != "auto":
        if r.weight_sync not in MODES:
            raise ConfigError(f"rollout.weight_sync {r.weight_sync!r} is not auto or one of {', '.join(MODES)}")
        return r.weight_sync
    if not engine_kind(replica_kind(cfg)).replica_transfer:
        return "object_store"
    own_gpus = (not r.colocate and r.gpus_per_engine > 0) or (r.colocate and share_gpu(cfg) == 0)
    return "broadcast" if own_gpus else "directory"


def broadcast_backend(cfg: TrainConfig) -> str:
    """rollout.broadcast_backend with `auto` resolved: nccl when the replicas have GPUs, else gloo."""
    r = cfg.rollout
    if r.broadcast_backend != "auto":
        if r.broadcast_backend not in ("gloo", "nccl"):
            raise ConfigError(f"rollout.broadcast_backend {r.broadcast_backend!r} is not auto, gloo or nccl")
        return r.broadcast_backend
    gpus = share_gpu(cfg) if r.colocate else r.gpus_per_engine
    return "nccl" if gpus > 0 else "gloo"


class WeightSync:
    """Moves the policy's weights from `workers` (memrl.training.ranks.worker_group) into `engines` (memrl.engines.ray_engines.RayEngines)."""

    def __init__(self, cfg: TrainConfig, workers: WorkerGroup, engines: Any, out_dir: Path) -> None:
        self.cfg, self.workers, self.engines = cfg, workers, engines
        self.mode = resolve_mode(cfg)
        self.backend = broadcast_backend(cfg) if self.mode == "broadcast" else ""
        self.dir = Path(cfg.rollout.sync_dir or out_dir / "engine_weights").resolve()
        self.joined = False
        self.last: dict[str, float] = {}

    def __call__(self) -> float:
        """One sync; returns its seconds (time/sync_s). `last` holds the parts (gather, send, load)."""
        t0 = time.perf_counter()
        if self.mode == "object_store":
            self.engines.update_weights(self.workers.weights_for_engines())
            self.last = {"load_s": self.engines.last_load_s}
        elif self.mode == "directory":
            write_s = self.workers.write_weights(str(self.dir))
            self.engines.update_weights(str(self.dir))
            self.last = {"write_s": write_s, "load_s": self.engines.last_load_s}
        else:
            if not self.joined:
                self._join()
            gather_s, send_s = self._together(self.workers.send_weights, self.engines.receive_weights)
            self.last = {"gather_s": gather_s, "send_s": send_s, "load_s": self.engines.last_load_s}
        return time.perf_counter() - t0

    def _join(self) -> None:
        host, port = self.workers.transfer_address()
        r = self.cfg.rollout
        spec = TransferSpec(host, port, 1 + self.engines.transfer_members, self.backend,
                            bucket_bytes=max(1, r.broadcast_bucket_mb) << 20)
        self._together(lambda: self.workers.join_transfer(spec), lambda: self.engines.init_weight_transfer(spec, 1))
        self.joined = True

    @staticmethod
    def _together(sender: Any, receivers: Any) -> Any:
        """Run the sender and the receivers at once (both block until the collective is done); the
        sender's result, or the first error of either side."""
        with ThreadPoolExecutor(2, thread_name_prefix="memrl-sync") as pool:
            fs, fr = pool.submit(sender), pool.submit(receivers)
            try:
                return fs.result()
            finally:
                fr.result()
