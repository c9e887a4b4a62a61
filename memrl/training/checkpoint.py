"""Checkpoints: a HuggingFace directory (config, safetensors, tokenizer) plus `trainer_state.pt`
(optimizer, scheduler, RNG states, step, data position). Saves are atomic: everything is written to a
temporary sibling directory that is renamed into place, then the `latest` pointer is replaced, so a
kill during a save leaves the previous checkpoint intact and `latest` pointing at it.

The state file holds only tensors, numbers, strings, lists, tuples and dicts, and is read with
`torch.load(weights_only=True)`: a planted pickle that would run code is refused. Checkpoints written
before this change have the same content and load unchanged. On resume every candidate is verified
(safetensors header covers the file, state readable) and a damaged one is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memrl.errors import UserError, fault_point

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
LATEST = "latest"
STATE_KEYS = ("optimizer", "scheduler", "rng", "step", "data_position")
_STEP_DIR = re.compile(r"step_(\d+)")
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


def save_checkpoint(root: str | os.PathLike, step: int, model: Any, tokenizer: Any, state: dict[str, Any],
                    keep: int = 0, extra_files: dict[str, str] | None = None) -> Path:
    """Write `root/step_XXXXXX` atomically and point `root/latest` at it; prune to `keep` newest (0 = all).

    Fault points (MEMRL_FAULT_AT, tests only): ckpt_tmp, ckpt_weights, ckpt_state, ckpt_renamed, ckpt_latest.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        fault_point("ckpt_tmp")
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


def _check_weights(path: Path) -> None:
    """The safetensors file(s) of a HF directory have a readable header covering the whole file."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
    else:
        shards = ["model.safetensors"]
    for shard in shards:
        f = path / shard
        if not f.is_file():
            raise CheckpointError(f"{f} is missing")
        try:
            with safe_open(str(f), "pt") as st:
                st.keys()
        except Exception as e:  # noqa: BLE001 - SafetensorError is not exported under a stable name
            raise CheckpointError(f"{f}: not a complete safetensors file ({e})") from e
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
    if missing:
        raise CheckpointError(f"{f}: missing {', '.join(missing)}")
    return state


def verify_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Check a checkpoint directory is loadable; returns its trainer state or raises CheckpointError."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} does not exist")
    _check_weights(path)
    return load_state(path)


@dataclass
class ResumePoint:
    """The checkpoint a run resumes from, its verified state, and the damaged ones skipped on the way."""

    path: Path
    state: dict[str, Any]
    skipped: list[str]


def _candidates(root: Path) -> list[Path]:
    """Checkpoint dirs to try, best first: the one `latest` names, then the others newest first."""
    dirs = sorted((p for p in root.glob("step_*") if p.is_dir() and _STEP_DIR.fullmatch(p.name)),
                  key=lambda p: int(p.name[5:]), reverse=True)
    pointer = root / LATEST
    if pointer.is_file():
        try:
            name = pointer.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            log.warning("%s is unreadable (%s); trying the checkpoints newest first", pointer, e)
            return dirs
        if _STEP_DIR.fullmatch(name):
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
