"""Mixed precision: float32 master weights, bfloat16 compute (model.compute_dtype, engine.hf.compute_dtype).

The policy's weights and the optimizer's state stay float32; the forward and backward of the update, the
old-logprob and reference passes and the hf engine's forwards run under `torch.autocast` in bfloat16 (the
matrix products; norms, softmax and the loss stay float32 as autocast keeps them), and the logits are
cast to float32 before log-probabilities and the loss are taken. On the CPU this needs bfloat16
instructions (avx512_bf16 or AMX): without them bfloat16 matrix products are emulated and slower than
float32, so a bfloat16 compute dtype is refused there in one line. `auto` picks for the hardware:
bfloat16 where it has bfloat16 instructions (a CPU with avx512_bf16 or AMX, a GPU that supports it), else
float32, and says which in one log line (`resolve_compute_dtype`).
"""

from __future__ import annotations

import contextlib
import logging
from functools import cache
from pathlib import Path
from typing import Any

import torch

from memrl.config import ConfigError

log = logging.getLogger(__name__)

COMPUTE_DTYPES = ("float32", "bfloat16")
COMPUTE_CHOICES = (*COMPUTE_DTYPES, "auto")
"""What a compute_dtype setting may say: a dtype, or auto (chosen from the hardware)."""
_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@cache
def cpu_has_bf16() -> bool:
    """Whether this CPU has bfloat16 instructions (avx512_bf16 or AMX-BF16)."""
    probe = getattr(getattr(torch._C, "_cpu", None), "_is_avx512_bf16_supported", None)
    if probe is not None and probe():
        return True
    probe = getattr(getattr(torch._C, "_cpu", None), "_is_amx_tile_supported", None)
    if probe is not None and probe():
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def check_compute_dtype(compute_dtype: str | None, device: str, key: str) -> None:
    """ConfigError when `compute_dtype` (config key `key`) cannot run fast on `device`."""
    if compute_dtype is None or compute_dtype == "float32":
        return
    if compute_dtype not in COMPUTE_DTYPES:
        raise ConfigError(f"{key}={compute_dtype!r}: use one of {', '.join(COMPUTE_DTYPES)}")
    if torch.device(device or "cpu").type == "cpu" and not cpu_has_bf16():
        raise ConfigError(f"{key}=bfloat16 needs a CPU with bfloat16 instructions (avx512_bf16 or AMX); this one has "
                          "none, where bfloat16 is slower than float32: leave it unset (float32) or say auto")


def resolve_compute_dtype(compute_dtype: str | None, device: str, key: str) -> str | None:
    """`compute_dtype` with `auto` replaced by the dtype the hardware runs fastest (bfloat16 where `device` has
    bfloat16 instructions, else float32; one log line says which and why); any other value is checked
    (`check_compute_dtype`) and returned as given."""
    if compute_dtype != "auto":
        check_compute_dtype(compute_dtype, device, key)
        return compute_dtype
    dev = torch.device(device or "cpu")
    if dev.type == "cpu":
        fast = cpu_has_bf16()
        why = ("this CPU has bfloat16 instructions (avx512_bf16 or AMX)" if fast else
               "this CPU has no bfloat16 instructions (avx512_bf16 or AMX), where bfloat16 is slower than float32")
    else:
        fast = dev.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        why = f"{dev.type} {'supports' if fast else 'does not support'} bfloat16"
    chosen = "bfloat16" if fast else "float32"
    log.info("%s=auto: %s (%s)", key, chosen, why)
    return chosen


def torch_dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else _TORCH[name]


def autocast(device: torch.device | str, compute: torch.dtype | None, weights: torch.dtype | None = None) -> Any:
    """The block in which a forward computes in `compute` (autocast); no-op when `compute` is None or the
    weights' own dtype."""
    if compute is None or compute == weights or compute == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=compute)
