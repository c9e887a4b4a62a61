"""The trainer's worker group: the one contract between the driver and its training ranks.

`WorkerGroup` declares everything the trainer, the weight sync (memrl.training.sync.weight_sync), validation
and checkpointing call. `RankGroup` implements it once over N rank handles: a call starts the method on
every rank (collectives need them all), then waits for every result and returns rank 0's (the ranks
all-reduce their metrics, and rank 0 holds what is gathered). A handle runs a `PolicyWorker` method:

- `LocalRank`: the worker in the trainer's own process (world size 1): a direct call.
- `RayRank` (memrl.training.ranks.workers): a Ray actor holding one rank's worker: an actor call.

`train_rows` takes the mini-batch the driver weighed (memrl.training.update.packing.weigh: one weight per row
over the whole mini-batch) and sends each rank only its token-balanced share (packing.split). Under
sequence parallelism (trainer.sequence_parallel=S) the shares are per block of S consecutive ranks: the
data-parallel size is N / S, and the ranks of a block get the same rows (memrl.training.update.ulysses).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from memrl.training.update.packing import TrainBatch, split, split_rows
from memrl.types import Segment


class WorkerGroup(Protocol):
    """What the driver uses of its training ranks (built by memrl.training.ranks.workers.build_workers)."""

    world_size: int
    model: torch.nn.Module | None
    """The live policy module when the only rank runs in the trainer's process (the in-process engine
    shares it, the OpenAI-server sync saves it); None when the ranks are Ray actors."""
    opt: torch.optim.Optimizer | None
    """The live optimizer of an in-process rank; None for Ray ranks (see `optim_state`)."""
    sched: Any
    """The live learning-rate scheduler of an in-process rank; None for Ray ranks."""
    pg: Any
    """The Ray placement group of the ranks (colocated engines take their bundles); None in process."""

    def train_rows(self, batch: TrainBatch, step_scheduler: bool = True) -> dict[str, float]:
        """One optimizer step on the weighed mini-batch (each rank on its share); metrics over all of it."""
        ...

    def old_logprobs(self, rows: Sequence[Segment]) -> list[list[float]]:
        """algorithm.old_logprobs=trainer: each row's response logprobs under the current policy."""
        ...

    def old_logprobs_entropy(self, rows: Sequence[Segment]) -> tuple[list[list[float]], list[list[float]]]:
        """`old_logprobs` and each response token's entropy from the same forward (algorithm.aepo)."""
        ...

    def full_state(self) -> dict[str, torch.Tensor]:
        """The gathered model weights as CPU tensors, in the driver."""
        ...

    def weights_for_engines(self) -> Any:
        """What an engine's update_weights takes: in process the live state dict, for Ray ranks an
        object-store reference to the gathered one."""
        ...

    def optim_state(self) -> dict[str, Any]:
        """The optimizer state keyed by parameter name (memrl.training.ranks.distributed.full_optim_state)."""
        ...

    def probe_logprobs(self, prompt: list[int], tokens: list[int]) -> list[float]:
        """The policy's teacher-forced logprobs of `tokens` after `prompt` (every rank runs the forward;
        rank 0's): the trainer's side of rollout.sync_check (memrl.training.sync.sync_check)."""
        ...

    def save(self, root: str | Path, step: int, driver_state: dict[str, Any], keep: int = 0,
             extra_files: dict[str, str] | None = None) -> Path:
        """Checkpoint `root/step_XXXXXX` (memrl.training.ranks.workers.PolicyWorker.save); its path."""
        ...

    def transfer_address(self) -> tuple[str, int]:
        """Rank 0's node IP and a free port there: the weight-transfer group's rendezvous."""
        ...

    def join_transfer(self, spec: Any) -> None:
        """Rank 0 joins the weight-transfer group as its sender (blocks until the engines joined)."""
        ...

    def send_weights(self) -> tuple[float, float]:
        """Gather (collective), rank 0 broadcasts to the engines; (gather s, send s)."""
        ...

    def write_weights(self, path: str) -> float:
        """Gather (collective), rank 0 writes `path`/model.safetensors; seconds."""
        ...

    def close(self) -> None:
        """Leave the process group and release the ranks (Ray actors and their placement group)."""
        ...


class RankHandle(Protocol):
    """One training rank as the group drives it."""

    def start(self, method: str, *args: Any, publish: bool = False) -> Any:
        """Begin worker.`method`(*args) on the rank; a pending result for `wait`. `publish`: rank 0's
        result comes back as [reference] (Ray: an object-store reference, in a list so Ray hands it on
        unresolved; in process: the object itself)."""
        ...

    def wait(self, pending: list[Any]) -> list[Any]:
        """The results of pending calls on ranks of this kind, in order."""
        ...


class LocalRank:
    """The rank in the trainer's own process: a call runs at once."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def start(self, method: str, *args: Any, publish: bool = False) -> Any:
        out = getattr(self.worker, method)(*args)
        return [out] if publish else out

    def wait(self, pending: list[Any]) -> list[Any]:
        return list(pending)


class RankGroup:
    """`WorkerGroup` over rank handles (rank i = handles[i]). `model` / `opt` / `sched`: the in-process
    rank's live objects (None for remote ranks); `pg`: the ranks' placement group (None in process);
    `release`: called once by `close` after every rank closed, also when closing failed. `sequence_parallel`:
    S, the ranks of each block that share rows (1: every rank its own share)."""

    def __init__(self, handles: Sequence[RankHandle], *, model: torch.nn.Module | None = None,
                 opt: torch.optim.Optimizer | None = None, sched: Any = None, pg: Any = None,
                 release: Callable[[], None] | None = None, sequence_parallel: int = 1) -> None:
        if not handles:
            raise ValueError("RankGroup: no ranks")
        self.handles = list(handles)
        self.world_size = len(self.handles)
        if self.world_size % sequence_parallel:
            raise ValueError(f"RankGroup: trainer.sequence_parallel={sequence_parallel} must divide the "
                             f"{self.world_size} ranks")
        self.sp = sequence_parallel
        self.model, self.opt, self.sched, self.pg = model, opt, sched, pg
        self._release = release

    def _each(self, method: str, args: Sequence[tuple[Any, ...]], publish: bool = False) -> list[Any]:
        """worker.`method`(*args[i]) on every rank i at once; every rank's result."""
        pending = [h.start(method, *a, publish=publish) for h, a in zip(self.handles, args, strict=True)]
        return self.handles[0].wait(pending)

    def _all(self, method: str, *args: Any, publish: bool = False) -> list[Any]:
        return self._each(method, [args] * self.world_size, publish)

    def load_checkpoint(self, path: str, lr_scale: float = 1.0) -> None:
        """Every rank back to checkpoint `path` (PolicyWorker.load_checkpoint)."""
        self._all("load_checkpoint", path, lr_scale)

    def train_rows(self, batch: TrainBatch, step_scheduler: bool = True) -> dict[str, float]:
        dp = self.world_size // self.sp
        shares = [batch] if dp == 1 else split(batch, dp)
        return self._each("train_rows", [(shares[i // self.sp], step_scheduler) for i in range(self.world_size)])[0]

    def old_logprobs(self, rows: Sequence[Segment]) -> list[list[float]]:
        """Each row's response logprobs under the current policy (no gradient), each block of
        sequence-parallel ranks its token-balanced share (`split_rows`), in the rows' order."""
        return self._gathered("old_logprobs", rows)

    def old_logprobs_entropy(self, rows: Sequence[Segment]) -> tuple[list[list[float]], list[list[float]]]:
        """`old_logprobs` and each response token's entropy, shared out the same way."""
        pairs = self._gathered("old_logprobs_entropy", rows)
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _gathered(self, method: str, rows: Sequence[Segment]) -> list[Any]:
        """worker.`method` over the rows, each block of ranks its share; one result per row, in order
        (for old_logprobs_entropy a (logprobs, entropies) pair per row)."""
        dp = self.world_size // self.sp
        shares = [list(range(len(rows)))] if dp == 1 else split_rows(rows, dp)
        got = self._each(method, [([rows[i] for i in shares[r // self.sp]],) for r in range(self.world_size)])
        got = got[:: self.sp]  # one rank of each block (they all hold the block's rows)
        out: list[Any] = [None for _ in rows]
        for idx, res in zip(shares, got, strict=True):
            per_row = list(zip(*res, strict=True)) if method == "old_logprobs_entropy" else res
            for i, v in zip(idx, per_row, strict=True):
                out[i] = v
        return out

    def full_state(self) -> dict[str, torch.Tensor]:
        return self._all("full_state")[0]

    def weights_for_engines(self) -> Any:
        return self._all("engine_weights", publish=True)[0][0]

    def optim_state(self) -> dict[str, Any]:
        return self._all("optim_state")[0]

    def probe_logprobs(self, prompt: list[int], tokens: list[int]) -> list[float]:
        return self._all("probe_logprobs", list(prompt), list(tokens))[0]

    def save(self, root: str | Path, step: int, driver_state: dict[str, Any], keep: int = 0,
             extra_files: dict[str, str] | None = None) -> Path:
        return Path(self._all("save", str(root), step, driver_state, keep, extra_files)[0])

    def transfer_address(self) -> tuple[str, int]:
        h = self.handles[0]
        return tuple(h.wait([h.start("transfer_address")])[0])  # type: ignore[return-value]

    def join_transfer(self, spec: Any) -> None:
        self._all("join_transfer", spec)

    def send_weights(self) -> tuple[float, float]:
        return self._all("send_weights")[0]

    def write_weights(self, path: str) -> float:
        return self._all("write_weights", path)[0]

    def close(self) -> None:
        try:
            self._all("close")
        finally:
            if self._release is not None:
                release, self._release = self._release, None
                release()
