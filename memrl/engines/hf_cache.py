"""The KV cache of the transformers engine: transformers cache layers that grow a preallocated buffer (the
keyword a model's forward takes its cache by is memrl.model_open.cache_kwarg)."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers before the layered Cache API: cache_layer_class says so
    DynamicLayer = None

from memrl.engines.base import EngineError


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


class SlotKV:
    """The KV cache of engine.hf.kv_cache=slots: per layer one preallocated buffer [rows, H, capacity, D].

    Row r of the running batch owns slot r; its tokens sit at [0, lens[r]) with no padding in front. A row
    joins by having its own keys and values written into a free slot (`write_row`); a row leaves by the last
    row moving into its slot (`move_row`): the other rows are never copied. The buffers grow (one copy of the
    used part) only when a row needs more rows or positions than they hold.
    """

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.copied_bytes = 0
        """Bytes of keys and values copied between slots or into grown buffers (not the rows' own writes)."""

    @property
    def rows(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def ensure(self, rows: int, positions: int, used_rows: int, used_positions: int, like: torch.Tensor,
               max_rows: int) -> None:
        """Room for `rows` rows of `positions` positions; keeps slots [0, used_rows) up to used_positions."""
        if rows <= self.rows and positions <= self.capacity:
            return
        new_rows = min(max(rows, 2 * self.rows), max(max_rows, rows))
        new_cap = max(positions, int(1.25 * self.capacity), 64)
        _, h, _, d = like.shape
        for i in range(self.num_layers):
            k = like.new_zeros((new_rows, h, new_cap, d))
            v = like.new_zeros((new_rows, h, new_cap, d))
            if self.k and used_rows and used_positions:
                k[:used_rows, :, :used_positions] = self.k[i][:used_rows, :, :used_positions]
                v[:used_rows, :, :used_positions] = self.v[i][:used_rows, :, :used_positions]
                self.copied_bytes += 2 * k[:used_rows, :, :used_positions].numel() * k.element_size()
            if len(self.k) > i:
                self.k[i], self.v[i] = k, v
            else:
                self.k.append(k)
                self.v.append(v)

    def write_row(self, row: int, layer_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Slot `row` := one sequence's keys and values, [1, H, n, D] per layer (its own prefill)."""
        for i, (k, v) in enumerate(layer_kv):
            n = k.shape[2]
            self.k[i][row, :, :n] = k[0]
            self.v[i][row, :, :n] = v[0]

    def copy_row(self, src: int, dst: int, length: int) -> None:
        for i in range(self.num_layers):
            self.k[i][dst, :, :length] = self.k[i][src, :, :length]
            self.v[i][dst, :, :length] = self.v[i][src, :, :length]
            self.copied_bytes += 2 * self.k[i][src, :, :length].numel() * self.k[i].element_size()

    def step_cache(self, rows: int, lens: torch.Tensor, width: int) -> Any:
        """A transformers Cache for one decode step of rows [0, rows): layer i writes the new token of row b
        at lens[b] and hands attention keys and values [rows, H, width, D]."""
        return _slot_step_cache(self, rows, lens, width)


class _SlotStepLayer:
    """One layer's view of SlotKV for one decode step (the part of transformers' cache-layer API a decoder
    layer and the mask code call)."""

    is_sliding = False
    is_compileable = False
    is_initialized = True

    def __init__(self, kv: SlotKV, i: int, rows: int, lens: torch.Tensor, width: int) -> None:
        self.kv, self.i, self.rows, self.lens, self.width = kv, i, rows, lens, width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        k, v = self.kv.k[self.i], self.kv.v[self.i]
        r = torch.arange(self.rows, device=k.device)
        k[r, :, self.lens] = key_states[:, :, 0]
        v[r, :, self.lens] = value_states[:, :, 0]
        return k[: self.rows, :, : self.width], v[: self.rows, :, : self.width]

    def get_seq_length(self, *args: Any) -> int:
        return self.width - 1

    def get_mask_sizes(self, *args: Any) -> tuple[int, int]:
        return self.width, 0


def _slot_step_cache(kv: SlotKV, rows: int, lens: torch.Tensor, width: int) -> Any:
    return Cache(layers=[_SlotStepLayer(kv, i, rows, lens, width) for i in range(kv.num_layers)])


class PrefixStore:
    """Keys and values of recently prefilled prompts, found again by their leading blocks of `block` tokens
    (engine.hf.prefix_cache_tokens). A block's key is a hash of all tokens up to its end, so a hit means
    the whole prefix is equal (the stored tokens are compared too: a hash collision is never used).
    Least recently used prompts leave first once more than `max_tokens` tokens are held."""

    def __init__(self, max_tokens: int, block: int = 16) -> None:
        self.max_tokens, self.block = max_tokens, block
        self.entries: dict[int, tuple[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self.by_hash: dict[int, tuple[int, int]] = {}  # chain hash -> (entry id, prefix length)
        self.held = 0
        self._next = 0

    def _chain(self, tokens: tuple[int, ...], limit: int) -> list[tuple[int, int]]:
        out, h = [], 0
        for end in range(self.block, limit + 1, self.block):
            h = hash((h, tokens[end - self.block : end]))
            out.append((h, end))
        return out

    def lookup(self, tokens: tuple[int, ...]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """(n, per-layer keys and values [1, H, n, D]) of the longest stored prefix of `tokens` that leaves
        at least one token to compute; (0, []) when none."""
        best: tuple[int, int] | None = None
        for h, end in self._chain(tokens, len(tokens) - 1):
            hit = self.by_hash.get(h)
            if hit is None:
                break
            best = hit[0], end
        if best is None:
            return 0, []
        eid, n = best
        stored, kv = self.entries.pop(eid)
        if stored[:n] != tokens[:n]:  # a hash collision
            self.entries[eid] = (stored, kv)
            return 0, []
        self.entries[eid] = (stored, kv)  # most recently used last
        return n, [(k[:, :, :n], v[:, :, :n]) for k, v in kv]

    def add(self, tokens: tuple[int, ...], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if len(tokens) < self.block or len(tokens) > self.max_tokens:
            return
        eid, self._next = self._next, self._next + 1
        self.entries[eid] = (tokens, kv)
        self.held += len(tokens)
        for h, end in self._chain(tokens, len(tokens)):
            self.by_hash[h] = (eid, end)
        while self.held > self.max_tokens:
            old = next(iter(self.entries))
            stored, _ = self.entries.pop(old)
            self.held -= len(stored)
            for h, _end in self._chain(stored, len(stored)):
                if self.by_hash.get(h, (None,))[0] == old:
                    del self.by_hash[h]

    def clear(self) -> None:
        self.entries.clear()
        self.by_hash.clear()
        self.held = 0
