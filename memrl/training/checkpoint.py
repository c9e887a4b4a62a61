"""Checkpoints: a HuggingFace directory (config, safetensors, tokenizer) plus `trainer_state.pt`
(optimizer, scheduler, RNG states, step, data position). Saves are atomic: everything is written to a
temporary sibling directory that is renamed into place, then the `latest` pointer is replaced, so a
kill during a save leaves the previous checkpoint intact and `latest` pointing at it.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
LATEST = "latest"


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
    """Write `root/step_XXXXXX` atomically and point `root/latest` at it; prune to `keep` newest (0 = all)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)
        for fname, text in (extra_files or {}).items():
            (tmp / fname).write_text(text, encoding="utf-8")
        if final.exists():  # re-saving the same step (e.g. after a resume): swap the old one out
            old = root / f".{name}-old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(name + "\n", encoding="utf-8")
    os.replace(pointer, root / LATEST)
    if keep > 0:
        steps = sorted(p for p in root.glob("step_*") if p.is_dir())
        for p in steps[:-keep]:
            if p != final:
                shutil.rmtree(p, ignore_errors=True)
    return final


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The checkpoint `root/latest` names, or None when there is none."""
    root = Path(root)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"checkpoint pointer {pointer} names {path}, which has no {STATE_FILE}")
    return path


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=False)
