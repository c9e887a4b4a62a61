"""Weight loading for the transformers engine: state dicts from HuggingFace directories and files."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


def strip_wrappers(name: str) -> str:
    for prefix in ("module.", "_orig_mod.", "_fsdp_wrapped_module."):
        while name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a .safetensors file, or of every *.safetensors (else pytorch_model*.bin) in a directory."""
    if path.is_file() and path.suffix == ".safetensors":
        return load_file(str(path))
    if not path.is_dir():
        raise FileNotFoundError(f"HFEngine.update_weights: {path} is neither a directory nor a .safetensors file")
    files = sorted(path.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"HFEngine.update_weights: no *.safetensors or pytorch_model*.bin in {path}")
    for f in bins:
        state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state
