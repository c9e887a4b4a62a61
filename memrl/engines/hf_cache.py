"""The KV cache of the transformers engine: transformers cache layers that grow a preallocated buffer,
and the name under which a model's forward takes its cache."""

from __future__ import annotations

import inspect
from typing import Any

import torch

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers before the layered Cache API: cache_layer_class says so
    DynamicLayer = None

from memrl.engines.base import EngineError


def cache_kwarg(model: Any) -> str:
    """The keyword of `model.forward` that takes the KV cache: `cache` (transformers' current name, e.g.
    Qwen2ForCausalLM in transformers 5.24), or `past_key_values` for a model whose forward names only
    that (older transformers, remote code). transformers 5.x still accepts `past_key_values` where it
    renamed it, with a FutureWarning on every run and removal announced for 5.40, so the new name is
    used wherever the signature has it; the two reach the same code (the argument is only renamed)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a readable signature: the current name
        return "cache"
    if "cache" not in params and "past_key_values" in params:
        return "past_key_values"
    return "cache"


def cache_layer_class() -> type:
    if DynamicLayer is None:  # transformers before the layered Cache API
        raise EngineError(
            "HFEngine needs a transformers version with transformers.cache_utils.DynamicLayer (the layered "
            "Cache API, transformers >= 4.56); this one has none"
        )

    class GrowingLayer(DynamicLayer):
        """A DynamicLayer that writes into a preallocated buffer grown geometrically, not torch.cat per step.

        Slots of left padding are zeroed on write (`pad_valid`), so a NaN from a fully masked padded query
        can never reach a later layer through the cache.
        """

        def __init__(self) -> None:
            super().__init__()
            self.kbuf: torch.Tensor | None = None
            self.vbuf: torch.Tensor | None = None
            self.length = 0
            self.pad_valid: torch.Tensor | None = None  # [B, n] bool for the tokens being written, or None
            self.min_capacity = 0  # allocate at least this many slots on first write (prompt + generation)

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            if not self.is_initialized:
                self.dtype, self.device = key_states.dtype, key_states.device
                self.is_initialized = True
            n = key_states.shape[-2]
            if self.pad_valid is not None:
                keep = self.pad_valid[:, None, :, None]
                key_states = key_states.masked_fill(~keep, 0.0)
                value_states = value_states.masked_fill(~keep, 0.0)
            need = self.length + n
            if self.kbuf is None or need > self.kbuf.shape[-2]:
                self.reserve(need, key_states)
            assert self.kbuf is not None and self.vbuf is not None
            self.kbuf[:, :, self.length : need] = key_states
            self.vbuf[:, :, self.length : need] = value_states
            self.length = need
            self.keys = self.kbuf[:, :, :need]
            self.values = self.vbuf[:, :, :need]
            return self.keys, self.values

        def reserve(self, need: int, like: torch.Tensor) -> None:
            cap = max(need, 64, self.min_capacity, int(1.5 * (self.kbuf.shape[-2] if self.kbuf is not None else 0)))
            b, h, _, d = like.shape
            kbuf = like.new_zeros((b, h, cap, d))
            vbuf = like.new_zeros((b, h, cap, d))
            if self.kbuf is not None and self.length:
                kbuf[:, :, : self.length] = self.kbuf[:, :, : self.length]
                vbuf[:, :, : self.length] = self.vbuf[:, :, : self.length]
            self.kbuf, self.vbuf = kbuf, vbuf

        def set_contents(self, keys: torch.Tensor, values: torch.Tensor, extra: int) -> None:
            """Replace the cache by (keys, values) [B, H, T, D], leaving room for `extra` more tokens."""
            b, h, t, d = keys.shape
            cap = max(t + extra, 64)
            self.kbuf = keys.new_zeros((b, h, cap, d))
            self.vbuf = values.new_zeros((b, h, cap, d))
            self.kbuf[:, :, :t] = keys
            self.vbuf[:, :, :t] = values
            self.length = t
            self.keys, self.values = self.kbuf[:, :, :t], self.vbuf[:, :, :t]
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

        def get_seq_length(self) -> int:
            return self.length

    return GrowingLayer
