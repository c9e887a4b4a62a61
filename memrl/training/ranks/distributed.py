"""Process groups and FSDP2 for the policy update: rank setup, collectives, full (gathered) state dicts for
saving and weight sync, and the optimizer's part of a checkpoint (`save_optim_dcp`, `load_optimizer`).

At world size 1 there is no process group: every collective here is the identity, so the single-process
trainer runs the same code. At world size N each rank trains on the share of the rows the driver sent it,
with the row weights the driver computed over the whole mini-batch (memrl.training.update.packing), and scales
its loss by N because FSDP averages gradients over ranks; the sum over ranks then equals the
single-process loss and gradient (measured: notes/scaleout.md).
"""

from __future__ import annotations

import datetime
import os
import socket
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from memrl.tcpstore import tcp_store
from memrl.training.checkpoints.checkpoint import OPTIM_DIR, dcp_reader, flatten_optim, unflatten_optim

TIMEOUT_S = 60
"""Collective timeout: a dead peer fails the step fast instead of hanging it."""
JOIN_TIMEOUT_S = 300
"""How long the rendezvous waits for every rank to join: a rank that is still starting (importing torch on
a loaded machine, a Ray actor waiting for a CPU) is not dead. Seen: 2 ranks on a 2-core machine busy with
other jobs missed a 60 s join ("Timed out after 61 seconds waiting for clients. 1/2 clients joined")."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: its rank, the world size, and the rendezvous address."""

    rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    backend: str = "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (bound with port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_group(info: DistInfo) -> None:
    """Join the default process group (no-op at world size 1 or when already joined)."""
    if info.world_size <= 1 or (dist.is_available() and dist.is_initialized()):
        return
    os.environ["MASTER_ADDR"] = info.master_addr
    os.environ["MASTER_PORT"] = str(info.master_port)
    if info.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1))
    # Our own store: joining may take JOIN_TIMEOUT_S, while the group's collectives keep TIMEOUT_S.
    # Rank 0 hosts the store, listening on master_addr only (memrl.tcpstore; torch's own binds all).
    store = tcp_store(info.master_addr, info.master_port, info.world_size, is_master=info.rank == 0,
                      timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S), wait_for_workers=True)
    dist.init_process_group(info.backend, store=store, rank=info.rank, world_size=info.world_size,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))


def leave_group() -> None:
    """Leave the default process group: a barrier first, then destroy it (no-op outside a group).

    The barrier lines the ranks up before any of them tears its connections down. gloo's barrier also waits
    for this rank's collectives still in flight (FSDP2 issues its reduce-scatters asynchronously). Without
    it, a rank that destroyed its group while its peer was still working was seen aborting at exit
    ("terminate called without an active exception", SIGABRT) on a loaded 2-core CI machine. A peer that
    is already gone fails the barrier; the group is destroyed all the same."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_world_size() > 1:
            dist.barrier()
    except (RuntimeError, dist.DistError) as e:  # a dead peer: say so, still leave
        warnings.warn(f"leaving the process group: barrier failed ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                      stacklevel=2)
    finally:
        dist.destroy_process_group()


def grouped() -> bool:
    """True when this process is in a process group: the model is then FSDP2-sharded (also a group of
    one, as the single-GPU check of the NCCL/FSDP2 path uses), its state dicts hold DTensors."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def block_group(size: int) -> Any:
    """This rank's process group among the blocks of `size` consecutive ranks (0..size-1, size..2*size-1,
    ...); every rank creates every block's group, as torch.distributed.new_group requires. None at size 1."""
    if size == 1:
        return None
    mine = None
    for start in range(0, world_size(), size):
        g = dist.new_group(list(range(start, start + size)), timeout=datetime.timedelta(seconds=TIMEOUT_S))
        if start <= rank() < start + size:
            mine = g
    return mine


def all_reduce_sum(values: list[float], device: str | torch.device = "cpu") -> list[float]:
    """Element-wise sum over ranks (float64 so counts stay exact)."""
    if world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(value: int, device: str | torch.device = "cpu") -> int:
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The repeated decoder blocks of a HF causal LM (`model.model.layers` for Llama/Qwen-style models; of a
    PEFT LoRA model, its base model's, whose blocks then hold the adapters)."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        model = model.get_base_model()
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"FSDP: cannot find decoder layers on {type(model).__name__} (expected model.model.layers)")
    return layers


def shard_model(model: torch.nn.Module, bf16: bool = False, cpu_offload: bool = False) -> torch.nn.Module:
    """FSDP2: `fully_shard` each decoder layer, then the root (a no-op at world size 1).

    bf16: compute in bfloat16, reduce gradients in float32; cpu_offload: parameters and optimizer
    state live on the CPU between uses."""
    if not grouped():
        return model

    kw: dict[str, Any] = {}
    if bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def _options(**kw: Any) -> Any:
    return StateDictOptions(**kw)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict as plain CPU tensors (gathered from the shards; rank 0 gets it,
    other ranks an empty dict). Plain modules: a CPU copy."""
    if not grouped():
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    return get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))


@contextmanager
def _untouched(opt: torch.optim.Optimizer) -> Iterator[None]:
    """A context that leaves an optimizer that has not stepped yet as it was: torch's optimizer state-dict
    helpers give it a state by running one step with zero gradients at learning rate 0, which leaves the
    weights alone but counts a step (Adam's bias corrections of the first real step would then be the
    second's). The state they return is kept; the optimizer forgets it afterwards."""
    fresh = not opt.state
    try:
        yield
    finally:
        if fresh:
            opt.state.clear()


def full_optim_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state keyed by parameter NAME (so it loads at any world size); full on rank 0. An
    optimizer that has not stepped yet stays so (_untouched)."""
    with _untouched(opt):
        osd = get_optimizer_state_dict(model, opt, options=_options(full_state_dict=True, cpu_offload=True))
    # Plain tensors (all of them at world size 1, `step` at any) alias the live state: the next optimizer
    # step would change the returned dict in place. Copies only.
    if "state" in osd:
        osd["state"] = {n: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in st.items()}
                        for n, st in osd["state"].items()}
    return osd


def load_optim_state(model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a name-keyed full optimizer state (from `full_optim_state` at any world size); each rank
    keeps its shard."""
    set_optimizer_state_dict(model, opt, state, options=_options(full_state_dict=True))


def save_optim_dcp(model: torch.nn.Module, opt: torch.optim.Optimizer, path: str | os.PathLike) -> dict[str, Any]:
    """Write the optimizer's tensors to the DCP directory `path` (collective: every rank writes its own
    shards; replicated tensors once). Returns the entries the caller stores beside them in the trainer
    state (`load_optimizer` reads them): optimizer_layout="dcp", optimizer_groups (the param groups, plain
    data, parameters by name) and optimizer_fresh (not stepped yet: a step-0 checkpoint, whose load must
    leave it so). An optimizer that has not stepped yet stays so (_untouched)."""
    fresh = not opt.state
    with _untouched(opt):
        osd = get_optimizer_state_dict(model, opt)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(flatten_optim(osd["state"]), checkpoint_id=os.fspath(path), no_dist=not grouped())
    return {"optimizer_layout": "dcp", "optimizer_groups": [dict(g) for g in osd["param_groups"]],
            "optimizer_fresh": fresh}


def load_optim_dcp(model: torch.nn.Module, opt: torch.optim.Optimizer, path: str | os.PathLike,
                   param_groups: list[dict[str, Any]]) -> None:
    """Load optimizer tensors written by save_optim_dcp at ANY world size into this rank's shards
    (collective; DCP reads the slices each rank owns), with the saved param groups."""
    osd = get_optimizer_state_dict(model, opt)  # initialises empty state: the shapes/shards to fill
    flat = flatten_optim(osd["state"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(flat, storage_reader=dcp_reader(path), no_dist=not grouped())
    set_optimizer_state_dict(model, opt, {"state": unflatten_optim(flat), "param_groups": param_groups})


def _is_name_keyed(optim_state: dict[str, Any]) -> bool:
    groups = optim_state.get("param_groups") or [{}]
    params = groups[0].get("params", [])
    return bool(params) and isinstance(params[0], str)


def load_optimizer(model: torch.nn.Module, opt: torch.optim.Optimizer, start: str | os.PathLike,
                   state: dict[str, Any]) -> None:
    """The optimizer state of checkpoint directory `start`, whose trainer state is `state`, in any layout memrl
    wrote: DCP (`save_optim_dcp`; collective), or older, the whole state in `state["optimizer"]` keyed by
    parameter name (any world size) or by index (world size 1 only). Saved with optimizer_fresh, it is left
    not stepped again (checkpoints without the key load as saved)."""
    if state.get("optimizer_layout") == "dcp":
        load_optim_dcp(model, opt, Path(start) / OPTIM_DIR, state["optimizer_groups"])
    elif _is_name_keyed(state["optimizer"]):  # checkpoints written before the DCP layout
        load_optim_state(model, opt, state["optimizer"])
    elif world_size() == 1:
        opt.load_state_dict(state["optimizer"])  # checkpoints written before name-keyed states
    else:
        raise ValueError(f"checkpoint {start}: its optimizer state is keyed by parameter index and "
                         "loads only at trainer.num_workers=1")
    if state.get("optimizer_fresh"):  # saved before the first step: the next step is the first again
        opt.state.clear()
