"""Checkpoints: a HuggingFace directory (config, safetensors, tokenizer, written by rank 0 from the
gathered weights) plus `trainer_state.pt` (scheduler, RNG states, step, data position, the optimizer's
param groups) and `optimizer/`, the optimizer's tensors as a `torch.distributed.checkpoint` (DCP)
directory: every rank writes its own shards, and DCP reshards on load, so a run resumes at any world
size. Saves are atomic: everything is written to a temporary sibling directory that is renamed into
place, then the `latest` pointer is replaced, so a kill during a save leaves the previous checkpoint
intact and `latest` pointing at it.

The state file holds only tensors, numbers, strings, lists, tuples and dicts, and is read with
`torch.load(weights_only=True)`: a planted pickle that would run code is refused. DCP's `.metadata` is a
pickle: it is read with an unpickler that admits only DCP's metadata classes (and only tensor entries,
so DCP never unpickles a value either). Older checkpoints keep the whole optimizer state in
`trainer_state.pt` (`optimizer`, keyed by parameter name or index) and load unchanged. On resume every
candidate is verified (safetensors header covers the file, state readable, every DCP shard file present
and long enough) and a damaged one is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from memrl.dcp_metadata import DCP_METADATA_CLASSES
from memrl.errors import UserError, fault_point
from memrl.quiet import hf_progress_off

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""A LoRA checkpoint's files (PEFT's format; memrl.training.update.lora writes them)."""

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
OPTIM_DIR = "optimizer"
"""The DCP directory of the optimizer's tensors inside a checkpoint (state key optimizer_layout="dcp")."""
LATEST = "latest"
STATE_KEYS = ("scheduler", "rng", "step", "data_position")
"""Keys every trainer_state.pt has; the optimizer is either `optimizer` (older layout) or
`optimizer_groups` + OPTIM_DIR (optimizer_layout="dcp")."""
STEP_DIR = re.compile(r"step_(\d+)")
"""The name of a step's checkpoint directory (step_<n>); the step guard lists and prunes them by it."""
_TEMP_DIR = re.compile(r"\.step_\d+-")


class CheckpointError(UserError):
    """A checkpoint is damaged or unreadable; the message names the file and what is wrong."""


def rng_state() -> dict[str, Any]:
    """Python and torch RNG states (CUDA too when present)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def temp_dir(root: str | os.PathLike, step: int, fixed: bool = False) -> Path:
    """A new, empty temporary directory for checkpoint `step` beside the checkpoints (removed by
    clean_stale if a save dies). fixed: the name every rank can compute (`.step_N-new`), replacing a
    leftover of that name; else a unique name."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    if not fixed:
        return Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    tmp = root / f".{name}-new"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def save_checkpoint(root: str | os.PathLike, step: int, model: Any, tokenizer: Any, state: dict[str, Any],
                    keep: int = 0, extra_files: dict[str, str] | None = None, tmp: Path | None = None) -> Path:
    """Write `root/step_XXXXXX` atomically and point `root/latest` at it; prune to `keep` newest (0 = all).
    `tmp`: a temp_dir other writers already put files in (the ranks' DCP optimizer shards); it becomes
    the checkpoint, or is removed on failure.

    Fault points (MEMRL_FAULT_AT, tests only): ckpt_tmp, ckpt_weights, ckpt_state, ckpt_renamed, ckpt_latest.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = Path(tmp) if tmp is not None else temp_dir(root, step)
    try:
        fault_point("ckpt_tmp")
        with hf_progress_off():  # no "Writing model shards" bar per checkpoint
            model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        fault_point("ckpt_weights")
        torch.save(state, tmp / STATE_FILE)
        for fname, text in (extra_files or {}).items():
            (tmp / fname).write_text(text, encoding="utf-8")
        fault_point("ckpt_state")
        if final.exists():  # re-saving the same step (e.g. after a resume): swap the old one out
            old = root / f".{name}-old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fault_point("ckpt_renamed")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(name + "\n", encoding="utf-8")
    os.replace(pointer, root / LATEST)
    fault_point("ckpt_latest")
    if keep > 0:
        steps = sorted(p for p in root.glob("step_*") if p.is_dir())
        for p in steps[:-keep]:
            if p != final:
                shutil.rmtree(p, ignore_errors=True)
    return final


def disk_full_message(root: str | os.PathLike, step: int, out_dir: str) -> str:
    """What a save of checkpoint `step` that found the disk full says: where, and what a resume uses."""
    root = Path(root)
    try:
        free = f"{shutil.disk_usage(root).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    try:
        prev = (root / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        prev = ""
    kept = (f"the previous checkpoint {root / prev} is intact; free space, then `memrl train --resume "
            f"out_dir={out_dir}` continues from it" if prev else "no checkpoint of this run was written yet")
    return f"the disk is full: saving checkpoint step_{step:06d} in {root} failed ({free}); {kept}"


def non_finite_message(e: BaseException, step: int, root: Path, model_path: str) -> str:
    """The run's step `step + 1` met a non-finite log-probability: which weights, and what is on disk under
    the checkpoint root `root` (whether the last checkpoint holds the weights that produced it)."""
    done = f"after {step} update(s)" if step else "before any update"
    try:
        latest = (root / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        latest = ""
    if not latest:
        kept = "no checkpoint of this run was written"
    elif step and latest == f"step_{step:06d}":  # saved after the update this rollout sampled from
        earlier = sorted(p.name for p in root.glob("step_*") if p.name < latest)
        kept = (f"the last checkpoint {root / latest} holds these weights (saved after step {step}'s update); "
                + (f"{root / earlier[-1]} predates them" if earlier else "no earlier checkpoint is kept"))
    else:
        kept = f"the last checkpoint {root / latest} is untouched"
    return (f"step {step + 1}: the policy (model.path={model_path}, {done} in this run) produced a "
            f"non-finite log-probability: {e}; {kept}")


def clean_stale(root: str | os.PathLike) -> list[str]:
    """Remove what a killed save left in `root` (temp dirs, a half-moved pointer); returns their names.

    A `.step_N-old` whose `step_N` is missing (killed mid-swap) is the only copy: it is moved back.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for p in sorted(root.iterdir()):
        if p.name.endswith("-old") and _TEMP_DIR.match(p.name):
            final = root / p.name[1:].rsplit("-", 1)[0]
            if not final.exists():
                os.replace(p, final)
                log.warning("restored %s from %s (a save was killed while replacing it)", final, p.name)
                continue
        if _TEMP_DIR.match(p.name) or p.name == f".{LATEST}.tmp":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            removed.append(p.name)
    if removed:
        log.warning("removed %d leftover(s) of an interrupted checkpoint save in %s: %s",
                    len(removed), root, ", ".join(removed))
    return removed


def check_adapter_checkpoint(path: Path) -> bool:
    """For checkpoint verification: True when `path` holds a LoRA adapter (then checked: a JSON config and
    a complete safetensors file), False when it holds none (a full HuggingFace directory)."""
    conf = path / ADAPTER_CONFIG
    if not conf.is_file():
        return False
    try:
        json.loads(conf.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{conf}: not valid JSON") from e
    _check_safetensors(path / ADAPTER_WEIGHTS)
    return True


def _check_safetensors(f: Path) -> None:
    """`f` exists and its safetensors header is readable and covers the whole file."""
    if not f.is_file():
        raise CheckpointError(f"{f} is missing")
    try:
        with safe_open(str(f), "pt") as st:
            st.keys()
    except Exception as e:  # noqa: BLE001 - SafetensorError is not exported under a stable name
        raise CheckpointError(f"{f}: not a complete safetensors file ({e})") from e


def _check_weights(path: Path) -> None:
    """The safetensors file(s) of a HF directory have a readable header covering the whole file."""
    if check_adapter_checkpoint(path):  # a LoRA checkpoint: PEFT's adapter files (the base is model.path)
        return

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
    else:
        shards = ["model.safetensors"]
    for shard in shards:
        _check_safetensors(path / shard)
    cfg = path / "config.json"
    try:
        json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{cfg}: missing or not valid JSON") from e


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """The trainer state of a checkpoint, read without running any pickled code (weights_only=True)."""
    f = Path(path) / STATE_FILE
    if not f.is_file():
        raise CheckpointError(f"{f} is missing")
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError / UnpicklingError / EOFError
        text = str(e).strip()
        first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(e).__name__
        if "Weights only load failed" in first or "Unsupported global" in str(e):
            raise CheckpointError(f"{f}: refused, it holds objects other than tensors and plain data "
                                  "(a pickle that could run code)") from e
        raise CheckpointError(f"{f}: not a readable torch state file ({first})") from e
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if isinstance(state, dict) and "optimizer" not in state and (
            state.get("optimizer_layout") != "dcp" or "optimizer_groups" not in state):
        missing.append("optimizer")
    if missing:
        raise CheckpointError(f"{f}: missing {', '.join(missing)}")
    return state


def verify_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Check a checkpoint directory is loadable; returns its trainer state or raises CheckpointError."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} does not exist")
    _check_weights(path)
    state = load_state(path)
    if state.get("optimizer_layout") == "dcp":
        check_dcp(path / OPTIM_DIR)
    return state


# ---------------------------------------------------------------------------- DCP optimizer shards
class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's metadata classes and torch dtypes only: anything else in `.metadata` is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in DCP_METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata")


def read_dcp_metadata(path: str | os.PathLike) -> Any:
    """The `.metadata` of a DCP directory, unpickled with _MetadataUnpickler; CheckpointError when it is
    missing, damaged, holds other objects, or describes anything but tensors."""
    f = Path(path) / ".metadata"
    if not f.is_file():
        raise CheckpointError(f"{f} is missing")
    try:
        with f.open("rb") as fh:
            md = _MetadataUnpickler(fh).load()
    except Exception as e:  # noqa: BLE001 - truncation: EOFError/UnpicklingError; planted: UnpicklingError
        raise CheckpointError(f"{f}: not readable DCP metadata ({type(e).__name__}: {e})") from e
    if not isinstance(md, Metadata) or not isinstance(md.storage_data, dict):
        raise CheckpointError(f"{f}: not DCP metadata")
    other = [k for k, v in md.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata)]
    if other:
        raise CheckpointError(f"{f}: entries other than tensors ({', '.join(other[:3])}); memrl writes tensors only")
    return md


def check_dcp(path: str | os.PathLike) -> None:
    """Every shard file the metadata names exists and covers the byte ranges it is said to hold."""
    path = Path(path)
    md = read_dcp_metadata(path)
    ends: dict[str, int] = {}
    for info in md.storage_data.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), int(info.offset) + int(info.length))
    for rel, end in sorted(ends.items()):
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"{f} is missing")
        if f.stat().st_size < end:
            raise CheckpointError(f"{f}: {f.stat().st_size} bytes, the metadata expects at least {end}")


def dcp_reader(path: str | os.PathLike) -> Any:
    """A FileSystemReader for `path` whose metadata goes through read_dcp_metadata."""
    class _Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            md = read_dcp_metadata(self.path)
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    return _Reader(path)


def read_optimizer(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's whole optimizer state keyed by parameter name, {"state", "param_groups"}, in one
    process: from OPTIM_DIR (DCP, any world size) or the older `optimizer` entry of trainer_state.pt."""
    state = torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
    if state.get("optimizer_layout") != "dcp":
        return state["optimizer"]
    md = read_dcp_metadata(Path(path) / OPTIM_DIR)
    flat = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(flat, storage_reader=dcp_reader(Path(path) / OPTIM_DIR), no_dist=True)
    return {"state": unflatten_optim(flat), "param_groups": state["optimizer_groups"]}


def flatten_optim(state: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{param name: {key: tensor}} -> {"param name/key": tensor} (DCP keys; names hold dots, not '/')."""
    return {f"{name}/{k}": v for name, st in state.items() for k, v in st.items()}


def unflatten_optim(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, v in flat.items():
        name, _, k = key.rpartition("/")
        out.setdefault(name, {})[k] = v
    return out


@dataclass
class ResumePoint:
    """The checkpoint a run resumes from, its verified state, and the damaged ones skipped on the way."""

    path: Path
    state: dict[str, Any]
    skipped: list[str]


def _candidates(root: Path) -> list[Path]:
    """Checkpoint dirs to try, best first: the one `latest` names, then the others newest first."""
    dirs = sorted((p for p in root.glob("step_*") if p.is_dir() and STEP_DIR.fullmatch(p.name)),
                  key=lambda p: int(p.name[5:]), reverse=True)
    pointer = root / LATEST
    if pointer.is_file():
        try:
            name = pointer.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            log.warning("%s is unreadable (%s); trying the checkpoints newest first", pointer, e)
            return dirs
        if STEP_DIR.fullmatch(name):
            named = root / name
            return [named] + [d for d in dirs if d != named]
        log.warning("%s names %r, not a step_N checkpoint; trying the checkpoints newest first", pointer, name)
    return dirs


def resume_point(root: str | os.PathLike) -> ResumePoint | None:
    """The newest loadable checkpoint under `root` (None when there is none at all).

    A damaged candidate is skipped with a warning naming what is wrong; CheckpointError when every
    checkpoint present is damaged (starting over silently would throw the run away).
    """
    root = Path(root)
    if not root.is_dir():
        return None
    cands = _candidates(root)
    skipped: list[str] = []
    for c in cands:
        try:
            state = verify_checkpoint(c)
        except CheckpointError as e:
            skipped.append(str(e))
            log.warning("checkpoint %s is not usable: %s; trying an older one", c.name, e)
            continue
        if skipped:
            log.warning("falling back to checkpoint %s (step %d)", c, int(state["step"]))
        return ResumePoint(c, state, skipped)
    if cands:
        raise CheckpointError(f"no usable checkpoint in {root}: " + "; ".join(skipped))
    return None


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest loadable checkpoint under `root` (see resume_point), or None when there is none."""
    point = resume_point(root)
    return point.path if point is not None else None
