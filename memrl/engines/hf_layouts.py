"""The KV-cache layouts of the transformers engine (engine.hf.kv_cache): how the running rows' keys and
values are kept, how admitted prompts are prefilled into them, one decode step over them, and how finished
rows leave.

- `padded`: an admission is prefilled together, left padded, into one padded cache that is rebuilt
  (merged, trimmed) when rows join or leave.
- `slots`: every row owns a slot of a preallocated cache (memrl.engines.hf_cache.SlotKV); an admission's
  distinct prompts are prefilled in right-padded passes grouped by their stored prefix (the block prefix
  cache, PrefixStore), optionally to a token budget between decode steps (prefill_chunk_tokens).

A layout does model work for the engine's worker thread only; it calls back into its engine for the
forward pass, the sampler and the count of running rows (`_rows_left`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from memrl.engines.hf_cache import PrefixStore, SlotKV
from memrl.engines.hf_scheduler import Request


class _Batch:
    """The running rows: their requests, the shared left-padded KV cache, mask, next positions and inputs."""

    def __init__(self, requests: list[Request], cache: Any, mask: torch.Tensor, next_pos: torch.Tensor,
                 last: torch.Tensor) -> None:
        self.requests = requests
        self.cache = cache  # transformers Cache of GrowingLayers
        self.mask = mask  # [B, T] long, 1 on real tokens
        self.next_pos = next_pos  # [B] long, position id of the next input token
        self.last = last  # [B] long, the next input token (last sampled)
        self.done = [False] * len(requests)

    prefill: list[_Partial] = []  # noqa: RUF012 - never written: the padded cache prefills at admission
    prefilling_rows = 0

    def __len__(self) -> int:
        return len(self.requests)


@dataclass
class _Partial:
    """engine.hf.prefill_chunk_tokens: a prompt being prefilled over several steps, for the requests that
    sent it; `cache` holds its first `done` tokens (prefix-cache hit included) once started."""

    key: tuple[int, ...]
    reqs: list[Request]
    cache: Any = None
    done: int = 0


class _SlotBatch:
    """The running rows of engine.hf.kv_cache=slots: row r owns slot r of `kv`, holding its lens[r] tokens."""

    def __init__(self, kv: SlotKV, requests: list[Request] | None = None, last: torch.Tensor | None = None,
                 lens: list[int] | None = None) -> None:
        self.kv = kv
        self.requests = requests if requests is not None else []
        self.last = last if last is not None else torch.zeros(0, dtype=torch.long)  # [B] the next input token
        self.lens = lens if lens is not None else []  # cached tokens of each row = position of its next input
        self.done = [False] * len(self.requests)
        self.prefill: list[_Partial] = []  # prefill_chunk_tokens: admitted prompts not yet wholly prefilled

    @property
    def prefilling_rows(self) -> int:
        return sum(len(p.reqs) for p in self.prefill)

    def __len__(self) -> int:
        return len(self.requests)


class PaddedLayout:
    """engine.hf.kv_cache=padded: one left-padded cache for the running rows."""

    def __init__(self, engine: Any) -> None:  # the HFEngine (memrl.engines.hf)
        self.engine = engine

    def admit(self, batch: _Batch | None, reqs: list[Request]) -> _Batch:
        t0 = time.perf_counter()
        out = self._admit(batch, reqs)
        self.engine.stats.prefill_s += time.perf_counter() - t0
        return out

    def _admit(self, batch: _Batch | None, reqs: list[Request]) -> _Batch:
        """Prefill `reqs` together (left padded), sample their first tokens, merge them into the batch."""
        dev = self.engine.device
        n, t = len(reqs), max(len(r.prompt_ids) for r in reqs)
        ids = torch.full((n, t), self.engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, t), dtype=torch.long)
        for i, r in enumerate(reqs):
            k = len(r.prompt_ids)
            ids[i, t - k :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, t - k :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        cache = self.engine._new_cache()
        padded = bool((mask == 0).any())
        headroom = max(r.max_new for r in reqs) + 1
        for layer in cache.layers:
            layer.pad_valid = mask.bool() if padded else None
            layer.min_capacity = t + headroom
        logits = self.engine._forward(ids, mask, pos, cache, rows=reqs)
        for layer in cache.layers:
            layer.pad_valid = None
        self.engine.stats.prefill_calls += 1
        self.engine.stats.prompt_tokens += sum(len(r.prompt_ids) for r in reqs)
        self.engine.stats.prefill_tokens += n * t
        self.engine.stats.padded_positions += n * t - sum(len(r.prompt_ids) for r in reqs)
        new = _Batch(reqs, cache, mask, mask.sum(-1), torch.zeros(n, dtype=torch.long, device=dev))
        self.engine._sample_into(new, logits)
        if batch is None or len(batch) == 0:
            return new
        t0 = time.perf_counter()
        out = self._merge(batch, new)
        self.engine.stats.cache_s += time.perf_counter() - t0
        return out

    def decode_step(self, batch: _Batch) -> None:
        """One decode step of every live row over the padded cache (its mask grows by one column)."""
        live = [i for i, d in enumerate(batch.done) if not d]
        if not live:
            return
        t0 = time.perf_counter()
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        logits = self.engine._forward(batch.last[:, None], batch.mask, batch.next_pos[:, None], batch.cache,
                                      rows=batch.requests)
        batch.next_pos = batch.next_pos + 1
        self.engine.stats.decode_steps += 1
        self.engine.stats.attended_positions += batch.mask.numel()
        self.engine.stats.padded_positions += batch.mask.numel() - int(batch.mask.sum())
        self.engine.stats.decode_s += time.perf_counter() - t0
        self.engine._sample_into(batch, logits)

    def retire(self, batch: _Batch) -> _Batch:
        t0 = time.perf_counter()
        try:
            return self._retire(batch)
        finally:
            self.engine.stats.cache_s += time.perf_counter() - t0

    def _retire(self, batch: _Batch) -> _Batch:
        """Drop finished rows once they are a quarter of the batch (or all of it); trim all-padding columns."""
        ndone = sum(batch.done)
        if ndone == 0:
            return batch
        if ndone < len(batch) and ndone * 4 < len(batch):
            return batch
        keep = [i for i, d in enumerate(batch.done) if not d]
        self.engine._rows_left(ndone)
        if not keep:
            return _Batch([], None, batch.mask[:0], batch.next_pos[:0], batch.last[:0])
        return self._select(batch, keep)

    def _select(self, batch: _Batch, keep: list[int]) -> _Batch:
        idx = torch.tensor(keep, dtype=torch.long, device=self.engine.device)
        mask = batch.mask.index_select(0, idx)
        first = int((mask.sum(0) > 0).nonzero()[0]) if mask.numel() else 0
        mask = mask[:, first:]
        for layer in batch.cache.layers:
            k = layer.keys.index_select(0, idx)[:, :, first:]
            v = layer.values.index_select(0, idx)[:, :, first:]
            layer.set_contents(k, v, extra=self._headroom(batch, keep))
            self.engine.stats.cache_copy_bytes += 2 * k.numel() * k.element_size()
        out = _Batch([batch.requests[i] for i in keep], batch.cache, mask,
                     batch.next_pos.index_select(0, idx), batch.last.index_select(0, idx))
        return out

    @staticmethod
    def _headroom(batch: _Batch, rows: list[int]) -> int:
        return max((batch.requests[i].max_new - len(batch.requests[i].tokens) for i in rows), default=0) + 1

    def _merge(self, old: _Batch, new: _Batch) -> _Batch:
        """One batch from two: unfinished rows of `old` then `new`, right-aligned (left padding)."""
        keep = [i for i, d in enumerate(old.done) if not d]
        dropped = len(old) - len(keep)
        if dropped:
            self.engine._rows_left(dropped)
        if not keep:
            return new
        t_old, t_new = old.mask.shape[1], new.mask.shape[1]
        t = max(t_old, t_new)
        idx = torch.tensor(keep, dtype=torch.long, device=self.engine.device)

        def left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
            if width == 0:
                return x
            shape = list(x.shape)
            shape[dim] = width
            return torch.cat([x.new_zeros(shape), x], dim=dim)

        mask = torch.cat([left_pad(old.mask.index_select(0, idx), t - t_old, 1), left_pad(new.mask, t - t_new, 1)])
        first = int((mask.sum(0) > 0).nonzero()[0])
        mask = mask[:, first:]
        headroom = max(self._headroom(old, keep), self._headroom(new, list(range(len(new)))))
        for lo, ln in zip(old.cache.layers, new.cache.layers, strict=True):
            k = torch.cat([left_pad(lo.keys.index_select(0, idx), t - t_old, 2), left_pad(ln.keys, t - t_new, 2)])
            v = torch.cat([left_pad(lo.values.index_select(0, idx), t - t_old, 2), left_pad(ln.values, t - t_new, 2)])
            lo.set_contents(k[:, :, first:], v[:, :, first:], extra=headroom)
            self.engine.stats.cache_copy_bytes += 2 * k[:, :, first:].numel() * k.element_size()
        out = _Batch(
            [old.requests[i] for i in keep] + new.requests,
            old.cache,
            mask,
            torch.cat([old.next_pos.index_select(0, idx), new.next_pos]),
            torch.cat([old.last.index_select(0, idx), new.last]),
        )
        out.done = [False] * len(keep) + list(new.done)
        return out


class SlotLayout:
    """engine.hf.kv_cache=slots: row r of the running batch owns slot r of a preallocated cache."""

    def __init__(self, engine: Any, prefix: PrefixStore | None) -> None:  # the HFEngine
        self.engine = engine
        self.prefix = prefix
        self.prefix_wave = -1  # deterministic: the wave whose prompts the prefix store holds

    def admit(self, batch: _SlotBatch | None, reqs: list[Request]) -> _SlotBatch:
        """Prefill the distinct prompts of `reqs` in batched passes (right padded, see `_prefill_group`), write
        each one's keys and values into the slots of the requests that sent it, sample their first tokens,
        append them to the batch.

        Two rounds, so that prompts of one admission still share their common start through the prefix cache:
        first the prompts with no stored prefix whose first block starts no earlier prompt of the round
        (the leaders), then, once the leaders are stored, the rest, each after its longest stored prefix. In
        each round prompts with the same stored prefix length are prefilled together."""
        if batch is None:
            batch = _SlotBatch(SlotKV(self.engine.num_layers))
        self.retire(batch)
        if self.prefix is not None and self.engine.deterministic and reqs[0].wave != self.prefix_wave:
            self.prefix.clear()  # a wave's numbers depend on that wave alone (exact resume)
            self.prefix_wave = reqs[0].wave
        t0 = time.perf_counter()
        kv, base = batch.kv, len(batch)
        copied = kv.copied_bytes
        first: dict[tuple[int, ...], int] = {}  # prompt -> the row of `reqs` whose prefill it reuses
        for j, r in enumerate(reqs):
            first.setdefault(tuple(r.prompt_ids), j)
        leaders, rest = self._leaders(reqs, list(first.values()))
        logits_of: dict[int, torch.Tensor] = {}
        slots = (kv, base, max(batch.lens, default=0), max(len(q.prompt_ids) + q.max_new + 1 for q in reqs),
                 base + len(reqs))
        for rnd in (leaders, rest):
            groups: dict[int, list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]] = {}
            for j in rnd:
                hit, prefix_kv = self.prefix.lookup(tuple(reqs[j].prompt_ids)) if self.prefix is not None else (0, [])
                groups.setdefault(hit, []).append((j, prefix_kv))
            for hit, rows in groups.items():
                rows.sort(key=lambda row: (len(reqs[row[0]].prompt_ids), row[0]))  # least padding
                start = 0
                while start < len(rows):  # the longest suffix of a pass x its rows within max_prefill_tokens
                    stop = start + 1
                    while stop < len(rows) and (stop + 1 - start) * (
                            len(reqs[rows[stop][0]].prompt_ids) - hit) <= self.engine.max_prefill_tokens:
                        stop += 1
                    self._prefill_group(reqs, rows[start:stop], hit, slots, logits_of)
                    start = stop
        for j, r in enumerate(reqs):  # the same prompt admitted together: computed once, its keys and values copied
            if first[tuple(r.prompt_ids)] != j:
                kv.copy_row(base + first[tuple(r.prompt_ids)], base + j, len(r.prompt_ids))
        self.engine.stats.prompt_tokens += sum(len(r.prompt_ids) for r in reqs)
        self.engine.stats.cache_copy_bytes += kv.copied_bytes - copied
        self.engine.stats.prefill_s += time.perf_counter() - t0
        new = _SlotBatch(kv, list(reqs), torch.zeros(len(reqs), dtype=torch.long, device=self.engine.device),
                         [len(r.prompt_ids) for r in reqs])
        self.engine._sample_into(new, torch.cat([logits_of[first[tuple(r.prompt_ids)]] for r in reqs]))
        batch.requests += new.requests
        batch.lens += new.lens
        batch.done += new.done
        batch.last = torch.cat([batch.last.to(self.engine.device), new.last])
        return batch

    def _leaders(self, reqs: list[Request], distinct: list[int]) -> tuple[list[int], list[int]]:
        """(prompts prefilled in the first round, the rest): a prompt goes second when the prefix cache holds
        a start of it already, or when its first block starts a leader that the cache will store (it then
        reuses at least that block)."""
        if self.prefix is None:
            return distinct, []
        b, leaders, rest, heads = self.prefix.block, [], [], set()
        for j in distinct:
            key = tuple(reqs[j].prompt_ids)
            if (len(key) > b and key[:b] in heads) or self.prefix.lookup(key)[0]:
                rest.append(j)
                continue
            leaders.append(j)
            if b <= len(key) <= self.prefix.max_tokens:
                heads.add(key[:b])
        return leaders, rest

    def _prefill_group(self, reqs: list[Request], rows: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]],
                       hit: int, slots: tuple, logits_of: dict[int, torch.Tensor]) -> None:
        """One prefill pass over the prompts reqs[j] for (j, stored prefix) in `rows`, all after a stored prefix
        of `hit` tokens: the rest of each prompt right padded to the longest (with causal attention a real
        token never attends to the padding after it, so no mask is needed), every row's logits taken at its
        last real token and only its real positions written into its slot (and the prefix cache)."""
        kv, base, used, need, total_rows = slots
        lens = [len(reqs[j].prompt_ids) for j, _ in rows]
        n, width = len(rows), max(lens) - hit
        ids = torch.full((n, width), self.engine.pad_token_id, dtype=torch.long)
        for i, (j, _) in enumerate(rows):
            ids[i, : lens[i] - hit] = torch.tensor(reqs[j].prompt_ids[hit:], dtype=torch.long)
        cache = self.engine._new_cache()
        for layer in cache.layers:
            layer.min_capacity = hit + width
        if hit:
            for li, layer in enumerate(cache.layers):
                keys = torch.cat([prefix_kv[li][0] for _, prefix_kv in rows]) if n > 1 else rows[0][1][li][0]
                values = torch.cat([prefix_kv[li][1] for _, prefix_kv in rows]) if n > 1 else rows[0][1][li][1]
                layer.set_contents(keys, values, extra=width)
        pos = torch.arange(hit, hit + width, device=self.engine.device)[None, :].repeat(n, 1)
        mask = torch.ones((n, hit + width), dtype=torch.long, device=self.engine.device)
        logits = self.engine._forward(ids.to(self.engine.device), mask, pos, cache,
                               last=None if n == 1 else [k - hit - 1 for k in lens])
        self.engine.stats.prefill_calls += 1
        self.engine.stats.prefill_tokens += n * width
        self.engine.stats.padded_positions += n * width - sum(k - hit for k in lens)
        self.engine.stats.prefix_hit_tokens += n * hit
        kv.ensure(total_rows, need, base, used, cache.layers[0].keys, self.engine.max_batch_size)
        for i, (j, _) in enumerate(rows):
            own = [(layer.keys[i : i + 1, :, : lens[i]], layer.values[i : i + 1, :, : lens[i]])
                   for layer in cache.layers]
            if self.prefix is not None:  # a batch's rows are stored apart (evicting one frees its memory)
                self.prefix.add(tuple(reqs[j].prompt_ids), own if n == 1 else [(k.clone(), v.clone()) for k, v in own])
            kv.write_row(base + j, own)
            logits_of[j] = logits[i : i + 1]

    def queue(self, batch: _SlotBatch | None, reqs: list[Request]) -> _SlotBatch:
        """prefill_chunk_tokens: queue the admitted prompts for prefilling (a prompt already queued is
        prefilled once for every request that sent it)."""
        if batch is None:
            batch = _SlotBatch(SlotKV(self.engine.num_layers))
        for r in reqs:
            key = tuple(r.prompt_ids)
            same = next((p for p in batch.prefill if p.key == key), None)
            if same is not None:
                same.reqs.append(r)
            else:
                batch.prefill.append(_Partial(key, [r]))
        return batch

    def prefill_chunks(self, batch: _SlotBatch) -> None:
        """Prefill the queued prompts, first come first, until prefill_chunk_tokens prompt tokens are computed
        (a prompt's prefix-cache hit is not computed, so it does not count); a prompt cut by the budget goes on
        from there at the next step. Prompts completed here join the batch with their first token."""
        t0 = time.perf_counter()
        budget = self.engine.prefill_chunk_tokens
        ready: list[tuple[_Partial, torch.Tensor]] = []
        i = 0  # completed prompts stay queued until they joined (a failure reaches their callers)
        while budget > 0 and i < len(batch.prefill):
            p = batch.prefill[i]
            if all(r.future.cancelled() for r in p.reqs):  # every caller gave up: nothing to compute
                batch.prefill.pop(i)
                self.engine._rows_left(len(p.reqs))
                continue
            n = len(p.key)
            if p.cache is None:  # its first chunk: start after the longest stored prefix
                hit, prefix_kv = self.prefix.lookup(p.key) if self.prefix is not None else (0, [])
                p.cache = self.engine._new_cache()
                for layer in p.cache.layers:
                    layer.min_capacity = n
                for layer, (k, v) in zip(p.cache.layers, prefix_kv, strict=False):
                    layer.set_contents(k, v, extra=n - hit)
                p.done = hit
                self.engine.stats.prefix_hit_tokens += hit
            end = min(n, p.done + budget)
            ids = torch.tensor([p.key[p.done : end]], dtype=torch.long, device=self.engine.device)
            pos = torch.arange(p.done, end, device=self.engine.device)[None, :]
            mask = torch.ones((1, end), dtype=torch.long, device=self.engine.device)
            logits = self.engine._forward(ids, mask, pos, p.cache)
            self.engine.stats.prefill_calls += 1
            self.engine.stats.prefill_tokens += end - p.done
            budget -= end - p.done
            p.done = end
            if end < n:
                self.engine.stats.prefill_chunks += 1
                continue
            i += 1
            if self.prefix is not None:
                self.prefix.add(p.key, [(layer.keys, layer.values) for layer in p.cache.layers])
            ready.append((p, logits))
        self.engine.stats.prefill_s += time.perf_counter() - t0
        if ready:
            self._join(batch, ready)
            del batch.prefill[:i]

    def _join(self, batch: _SlotBatch, ready: list[tuple[_Partial, torch.Tensor]]) -> None:
        """Write the wholly prefilled prompts into slots after the running rows and sample their first tokens."""
        self.retire(batch)
        t0 = time.perf_counter()
        kv, base = batch.kv, len(batch)
        copied = kv.copied_bytes
        reqs = [r for p, _ in ready for r in p.reqs]
        need = max(len(q.prompt_ids) + q.max_new + 1 for q in reqs)
        kv.ensure(base + len(reqs), need, base, max(batch.lens, default=0), ready[0][0].cache.layers[0].keys,
                  self.engine.max_batch_size)
        row, logits_rows = base, []
        for p, logits in ready:
            kv.write_row(row, [(layer.keys, layer.values) for layer in p.cache.layers])
            for extra in range(1, len(p.reqs)):  # the same prompt sent again: its keys and values copied
                kv.copy_row(row, row + extra, len(p.key))
            logits_rows += [logits] * len(p.reqs)
            row += len(p.reqs)
            p.cache = None
        self.engine.stats.prompt_tokens += sum(len(r.prompt_ids) for r in reqs)
        self.engine.stats.cache_copy_bytes += kv.copied_bytes - copied
        self.engine.stats.cache_s += time.perf_counter() - t0
        new = _SlotBatch(kv, reqs, torch.zeros(len(reqs), dtype=torch.long, device=self.engine.device),
                         [len(r.prompt_ids) for r in reqs])
        self.engine._sample_into(new, torch.cat(logits_rows))
        batch.requests += new.requests
        batch.lens += new.lens
        batch.done += new.done
        batch.last = torch.cat([batch.last.to(self.engine.device), new.last])

    def decode_step(self, batch: _SlotBatch) -> None:
        self.retire(batch)
        if not len(batch):
            return
        t0 = time.perf_counter()
        rows = len(batch)
        width = max(batch.lens) + 1
        lens = torch.tensor(batch.lens, dtype=torch.long, device=self.engine.device)
        mask = (torch.arange(width, device=self.engine.device)[None, :] <= lens[:, None])[:, None, None, :]
        cache = batch.kv.step_cache(rows, lens, width)
        logits = self.engine._forward(batch.last[:, None], mask, lens[:, None], cache)
        batch.lens = [n + 1 for n in batch.lens]
        self.engine.stats.decode_steps += 1
        self.engine.stats.attended_positions += rows * width
        self.engine.stats.padded_positions += rows * width - sum(batch.lens)
        self.engine.stats.decode_s += time.perf_counter() - t0
        self.engine._sample_into(batch, logits)

    def retire(self, batch: _SlotBatch) -> _SlotBatch:
        """Drop finished rows: each hole takes the last live row (one row's copy); the others stay put."""
        ndone = sum(batch.done)
        if not ndone:
            return batch
        t0 = time.perf_counter()
        self.engine._rows_left(ndone)
        before = batch.kv.copied_bytes
        order = list(range(len(batch)))
        i, j = 0, len(batch) - 1
        while True:
            while j >= 0 and batch.done[j]:
                j -= 1
            while i < j and not batch.done[i]:
                i += 1
            if i >= j:
                break
            batch.kv.copy_row(j, i, batch.lens[j])
            order[i] = j
            batch.requests[i], batch.lens[i], batch.done[i], batch.done[j] = (
                batch.requests[j], batch.lens[j], False, True)
        live = j + 1
        idx = torch.tensor(order[:live], dtype=torch.long, device=batch.last.device)
        batch.last = batch.last.index_select(0, idx)
        del batch.requests[live:], batch.lens[live:], batch.done[live:]
        self.engine.stats.cache_copy_bytes += batch.kv.copied_bytes - before
        self.engine.stats.cache_s += time.perf_counter() - t0
        return batch

