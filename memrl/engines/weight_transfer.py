"""Weight transfer by collective broadcast: the trainer (rank 0) sends its gathered weights to every
engine process (ranks 1..N) of a process group of their own.

The group is built from a TCPStore hosted by rank 0 and a PrefixStore, so it never touches the default
process group of the trainer's FSDP ranks or of vLLM's workers. One broadcast protocol for both
backends: `gloo` (CPU tensors) and `nccl` (CUDA tensors), chosen by config, so the code the GPU path
runs is the code CPU tests run.

Protocol of one `send` / `receive` (every member calls it, rank 0 sends):
1. header: a uint8 tensor of JSON (its length broadcast first): the tensors' names, dtypes and shapes
   in order, and the buckets (consecutive tensors, at most `bucket_bytes` each);
2. each bucket: one flat uint8 buffer holding its tensors' bytes back to back.
The receiver rebuilds views of each bucket (`view(dtype).reshape(shape)`) and hands them on as
(name, tensor) pairs while later buckets are still to come. JSON, not pickle: nothing received runs.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from memrl.tcpstore import tcp_store

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}

BUCKET_BYTES = 256 << 20
"""Default bucket size: big enough for few calls, small enough to bound the receiver's extra memory."""


@dataclass(frozen=True)
class TransferSpec:
    """Where the group meets and how big it is (rank 0 = the trainer; engines take ranks 1..world_size-1;
    world_size 1 = the sender alone, a check of the backend on one device)."""

    host: str
    port: int
    world_size: int
    backend: str = "gloo"
    """gloo (tensors on CPU) or nccl (tensors on the member's current CUDA device)."""
    name: str = "memrl-weights"
    timeout_s: float = 120.0
    bucket_bytes: int = BUCKET_BYTES

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"weight transfer backend {self.backend!r} is not gloo or nccl")
        if self.world_size < 1:
            raise ValueError(f"weight transfer needs at least the sender, world_size={self.world_size}")


class WeightTransfer:
    """One member of the weight-transfer group (blocks until all world_size members joined)."""

    def __init__(self, spec: TransferSpec, rank: int, device: str | torch.device | None = None) -> None:
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"weight transfer rank {rank} is outside 0..{spec.world_size - 1}")
        self.spec, self.rank = spec, rank
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        if spec.backend == "nccl":
            if not torch.cuda.is_available():
                raise RuntimeError("weight transfer backend nccl needs CUDA, torch.cuda.is_available() is False")
            self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        # rank 0 hosts the store, listening on spec.host only (memrl.tcpstore)
        store = tcp_store(spec.host, spec.port, spec.world_size, is_master=rank == 0, timeout=timeout,
                          wait_for_workers=False)
        prefix = dist.PrefixStore(spec.name, store)
        if spec.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg: Any = dist.ProcessGroupNCCL(prefix, rank, spec.world_size, opts)
        else:
            self.pg = dist.ProcessGroupGloo(prefix, rank, spec.world_size, timeout)
        self._store = store  # rank 0 hosts it: keep it alive as long as the group
        self.bytes_sent = 0

    def _bcast(self, t: torch.Tensor) -> torch.Tensor:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()
        return t

    # ------------------------------------------------------------------ sender
    def send(self, weights: Mapping[str, torch.Tensor], skip: tuple[str, ...] = ()) -> int:
        """Rank 0: broadcast every tensor of `weights` (names in `skip` left out); returns bytes sent."""
        if self.rank != 0:
            raise RuntimeError(f"WeightTransfer.send on rank {self.rank}: only rank 0 sends")
        items = [(k, v) for k, v in weights.items() if k not in skip]
        meta, buckets, size, start = [], [], 0, 0
        for i, (k, v) in enumerate(items):
            dtype = str(v.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise ValueError(f"weight transfer: {k} has dtype {v.dtype}, not one of {sorted(DTYPES)}")
            n = v.numel() * v.element_size()
            if size and size + n > self.spec.bucket_bytes:
                buckets.append([start, i, size])
                start, size = i, 0
            meta.append([k, dtype, list(v.shape)])
            size += n
        if items:
            buckets.append([start, len(items), size])
        header = json.dumps({"tensors": meta, "buckets": buckets}).encode()
        self._bcast(torch.tensor([len(header)], dtype=torch.int64, device=self.device))
        self._bcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device))
        sent = 0
        for a, b, nbytes in buckets:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            off = 0
            for _, v in items[a:b]:
                flat = v.detach().reshape(-1).view(torch.uint8) if v.numel() else v.new_empty(0, dtype=torch.uint8)
                buf[off: off + flat.numel()].copy_(flat)
                off += flat.numel()
            self._bcast(buf)
            sent += nbytes
        self.bytes_sent += sent
        return sent

    # ------------------------------------------------------------------ receivers
    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Ranks 1..: yield (name, tensor) as the buckets arrive (tensors on this member's device, views
        of their bucket). Consume it to the end: every bucket is a collective call."""
        if self.rank == 0:
            raise RuntimeError("WeightTransfer.receive on rank 0: rank 0 sends")
        length = self._bcast(torch.zeros(1, dtype=torch.int64, device=self.device))
        raw = self._bcast(torch.zeros(int(length.item()), dtype=torch.uint8, device=self.device))
        header = json.loads(bytes(raw.cpu().numpy()).decode())
        meta = header["tensors"]
        for a, b, nbytes in header["buckets"]:
            buf = self._bcast(torch.empty(int(nbytes), dtype=torch.uint8, device=self.device))
            off = 0
            for name, dtype, shape in meta[a:b]:
                dt = DTYPES[dtype]
                n = math.prod(shape) * torch.empty(0, dtype=dt).element_size()
                yield name, buf[off: off + n].view(dt).reshape(shape)
                off += n

    def close(self) -> None:
        """Drop the group (the peers' next collective then fails instead of hanging)."""
        self.pg = None
        self._store = None


def receive_all(transfer: WeightTransfer) -> dict[str, torch.Tensor]:
    """Every tensor of one transfer, as a dict (for engines that load a whole state dict at once)."""
    return dict(transfer.receive())
