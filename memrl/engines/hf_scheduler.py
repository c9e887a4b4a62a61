"""The request scheduler of the transformers engine: the queue that concurrent `generate` calls go into,
deterministic waves, admission into the running batch, and the worker thread that runs the model work.

A request waits in `_pending` until the worker admits it: when `max_batch_size` requests wait or the oldest
has waited `max_wait_ms` (continuous batching), or, with `deterministic`, as part of its wave (the requests
one event-loop turn submitted), which is decoded without admitting later requests and whose completions
are handed back together, in submission order. The model work of a step (admit, prefill, decode, retire)
is the engine's (memrl.engines.hf.HFEngine and its KV layouts, memrl.engines.hf_layouts).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from memrl.engines.base import Completion, EngineError, NonFiniteLogprobError, SamplingParams

log = logging.getLogger("memrl.engines.hf")


@dataclass
class EngineStats:
    """Counters of an HFEngine since it was built (or since `reset`)."""

    requests: int = 0
    """generate() calls accepted."""
    completed: int = 0
    forward_calls: int = 0
    """Batched model forward passes (prefills + decode steps)."""
    prefill_calls: int = 0
    decode_steps: int = 0
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)
    """Histogram: rows in a forward pass -> number of such passes (prefill and decode)."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    """Seconds the worker spent in model work (forward, sampling, cache bookkeeping)."""
    weight_updates: int = 0
    prefill_tokens: int = 0
    """Prompt positions run through the model in prefills, padding included (prompts a prefill reused and
    identical prompts prefilled once are not counted again)."""
    padded_positions: int = 0
    """Positions of padding computed: padded prompt tokens in prefills (every layer's MLP and attention run on
    them) plus padded key positions decode steps attend over (summed over rows)."""
    attended_positions: int = 0
    """Key positions decode steps attend over, summed over rows (padding included)."""
    cache_copy_bytes: int = 0
    """Bytes of other rows' keys and values copied when rows join or leave (and when buffers grow)."""
    prefix_hit_tokens: int = 0
    """Prompt tokens whose keys and values came from the prefix cache instead of a prefill."""
    prefill_s: float = 0.0
    decode_s: float = 0.0
    """Seconds in decode-step forwards."""
    sample_s: float = 0.0
    """Seconds choosing tokens and logprobs from the logits (and the per-row bookkeeping)."""
    cache_s: float = 0.0
    """Seconds rebuilding, compacting or growing the KV cache when rows join or leave."""
    prefill_chunks: int = 0
    """engine.hf.prefill_chunk_tokens: prefill passes that stopped before the end of their prompt (the token
    budget of the step was spent; the rest comes in later steps)."""
    decode_steps_beside_prefill: int = 0
    """engine.hf.prefill_chunk_tokens: decode steps that ran while a prompt was part-way prefilled."""
    first_tokens: int = 0
    """Requests that got their first token."""
    first_token_wait_s: float = 0.0
    """Seconds from submission to the first token, summed over those requests (time to first token)."""
    max_first_token_s: float = 0.0
    """The longest time to first token."""
    max_decode_gap_s: float = 0.0
    """The longest wall time between two decode steps while rows were running (how long a running row was
    stalled, e.g. by prefills admitted between its steps)."""

    @property
    def max_batch_size(self) -> int:
        return max(self.batch_sizes, default=0)

    @property
    def mean_batch_size(self) -> float:
        """Average rows per forward pass, weighted by passes."""
        n = sum(self.batch_sizes.values())
        return sum(b * c for b, c in self.batch_sizes.items()) / n if n else 0.0

    @property
    def mean_first_token_s(self) -> float:
        return self.first_token_wait_s / self.first_tokens if self.first_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generate_seconds if self.generate_seconds > 0 else 0.0

    def reset(self) -> None:
        for f, v in EngineStats().__dict__.items():
            setattr(self, f, v)


@dataclass
class Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    stop_ids: frozenset[int]
    max_new: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    generator: torch.Generator | None
    submitted: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    seq: int = 0
    wave: int = 0


def settle_on_loop(loop: asyncio.AbstractEventLoop, results: list[tuple[Request, Any]]) -> None:
    """Set every (request, result) on `loop`, in one callback (so waiters resume in one turn, in order)."""
    def settle() -> None:
        for req, result in results:
            if req.future.done():
                continue
            if isinstance(result, BaseException):
                req.future.set_exception(result)
            else:
                req.future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's event loop is gone; nobody is waiting
        pass


class Scheduler:
    """Requests, waves and the worker thread of an HFEngine; the subclass supplies the model work:
    `_make_request`, `_admit`, `_prefill_chunks`, `_decode_step` and `_retire` (all but the first run on
    the worker thread, under `_model_lock` and inference mode)."""

    source = "(the policy being trained)"
    """What error messages call the model: its directory when loaded from one."""
    routing: Any = None
    """memrl.training.update.routing.EngineRouting: MoE experts recorded per request (algorithm.routing_replay=r3)."""

    def __init__(self, max_batch_size: int, max_wait_ms: float, max_prefill_tokens: int, deterministic: bool) -> None:
        self.max_batch_size = max_batch_size
        self.deterministic = deterministic
        self.max_wait_s = 0.0 if deterministic else max_wait_ms / 1000.0
        self.max_prefill_tokens = max(1, max_prefill_tokens)
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._pending: collections.deque[Request] = collections.deque()
        self._active = 0  # rows in the running batch (read under _cond)
        self._draining = False  # a weight update waits for the running rows to finish
        self._closed = False
        self._worker: threading.Thread | None = None
        self._model_lock = threading.Lock()
        self._seq = 0  # submission order of requests
        self._waves: dict[asyncio.AbstractEventLoop, list[Request]] = {}  # deterministic: the forming wave
        self._held: list[tuple[Request, Completion | BaseException]] = []  # deterministic: the running wave's results
        self._wave_count = 0  # deterministic: waves submitted so far (a request's `wave` is its wave's number)
        self._running_wave = 0  # deterministic: the wave whose rows the worker decodes (0 = none yet)
        self._last_decode: float | None = None  # when the last decode step ended, while rows run

    # the model work, supplied by the engine
    def _make_request(self, prompt_ids: list[int], sampling: SamplingParams) -> Request:
        raise NotImplementedError

    def _admit(self, batch: Any, reqs: list[Request]) -> Any:
        raise NotImplementedError

    def _prefill_chunks(self, batch: Any) -> None:
        raise NotImplementedError

    def _decode_step(self, batch: Any) -> None:
        raise NotImplementedError

    def _retire(self, batch: Any) -> Any:
        raise NotImplementedError

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """One completion of `prompt_ids`; concurrent calls are decoded together."""
        if self._closed:
            raise EngineError("HFEngine: generate() called after close()")
        req = self._make_request(prompt_ids, sampling)
        self._seq += 1
        req.seq = self._seq
        if self.deterministic:
            wave = self._waves.setdefault(req.loop, [])
            if not wave:  # runs after every coroutine already scheduled this turn has submitted
                req.loop.call_soon(self._submit_wave, req.loop)
            wave.append(req)
        else:
            self._submit([req])
        return await req.future

    def _submit(self, reqs: list[Request]) -> None:
        with self._cond:
            self._pending.extend(reqs)
            self.stats.requests += len(reqs)
            self._cond.notify_all()
        self._ensure_worker()

    def _submit_wave(self, loop: asyncio.AbstractEventLoop) -> None:
        wave = self._waves.pop(loop, [])
        if self._closed:
            for req in wave:
                req.future.set_exception(EngineError("HFEngine closed before the request ran"))
            return
        with self._cond:
            self._wave_count += 1
            for req in wave:
                req.wave = self._wave_count
        self._submit(wave)

    async def close(self) -> None:
        """Stop the worker; requests still waiting fail with EngineError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            await asyncio.to_thread(worker.join)
        with self._cond:
            pending, self._pending = list(self._pending), collections.deque()
        for req in pending:
            self._resolve(req, EngineError("HFEngine closed before the request ran"))
        self._release_held()

    def _resolve(self, req: Request, result: Completion | BaseException) -> None:
        """Hand `result` to the caller's loop (deterministic: held until the whole wave is done)."""
        if self.deterministic:
            with self._cond:
                self._held.append((req, result))
            return
        settle_on_loop(req.loop, [(req, result)])

    def _release_held(self) -> None:
        """Deterministic mode: hand back a finished wave's results at once, in submission order."""
        with self._cond:
            held, self._held = self._held, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Request, Completion | BaseException]]] = {}
        for req, result in sorted(held, key=lambda x: x[0].seq):
            by_loop.setdefault(req.loop, []).append((req, result))
        for loop, results in by_loop.items():
            settle_on_loop(loop, results)

    def _ensure_worker(self) -> None:
        with self._cond:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._worker_main, name="memrl-hf-engine", daemon=True)
                self._worker.start()

    def _take_admissions(self, batch: Any | None) -> list[Request]:
        """Block until there is work; return the requests to prefill now (possibly none if a batch runs)."""
        with self._cond:
            while True:
                if self._closed:
                    return []
                running = batch is not None and (len(batch) > 0 or batch.prefilling_rows > 0)
                # finished rows still in the batch are dropped by the merge, so they leave room
                free = self.max_batch_size - (
                    len(batch) - sum(batch.done) + batch.prefilling_rows if batch is not None else 0)
                if self.deterministic and running and self._pending and self._pending[0].wave != self._running_wave:
                    return []  # a later wave waits until every row of the running one is done (never merged)
                if self._pending and free > 0 and not self._draining:
                    waited = time.monotonic() - self._pending[0].submitted
                    if len(self._pending) >= free or waited >= self.max_wait_s:
                        return self._pop_admissions(free)
                    if not running:
                        self._cond.wait(timeout=self.max_wait_s - waited)
                        continue
                if running:
                    return []
                self._cond.wait(timeout=0.5 if self._pending else None)

    def _pop_admissions(self, free: int) -> list[Request]:
        out: list[Request] = []
        longest = 0
        while self._pending and len(out) < free:
            req = self._pending[0]
            if req.future.done():  # cancelled by its caller
                self._pending.popleft()
                continue
            if self.deterministic:  # one wave per batch: the requests of the next wave wait for this one
                if out and req.wave != out[0].wave:
                    break
                self._running_wave = req.wave
            longest_next = max(longest, len(req.prompt_ids))
            if out and longest_next * (len(out) + 1) > self.max_prefill_tokens:
                break
            out.append(self._pending.popleft())
            longest = longest_next
        self._active += len(out)
        return out

    def _worker_main(self) -> None:
        batch: Any | None = None
        while True:
            if self.deterministic and self._held and (batch is None or all(batch.done)) and not (
                    self._pending and self._pending[0].wave == self._running_wave):
                self._release_held()  # the running wave is done (a later wave may already be waiting)
            admit = self._take_admissions(batch)
            if self._closed:
                if batch is not None:
                    for req in self._requests_of(batch):
                        self._resolve(req, EngineError("HFEngine closed while the request was running"))
                with self._cond:
                    self._active = 0
                    self._cond.notify_all()
                return
            try:
                t0 = time.perf_counter()
                with self._model_lock, torch.inference_mode():
                    if admit:
                        batch = self._admit(batch, admit)
                    if batch is not None and batch.prefill:
                        self._prefill_chunks(batch)
                    if batch is not None and len(batch):
                        if batch.prefill and not all(batch.done):
                            self.stats.decode_steps_beside_prefill += 1
                        self._decode_step(batch)
                    if batch is not None:
                        batch = self._retire(batch)
                    if batch is None or all(batch.done):
                        self._last_decode = None  # no row waits for a next step
                self.stats.generate_seconds += time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - every waiting caller gets the error, the worker survives
                log.exception("HFEngine worker step failed")
                failed = (self._requests_of(batch) if batch is not None else []) + admit
                seen: set[int] = set()
                for req in failed:
                    if id(req) not in seen:
                        seen.add(id(req))
                        self._resolve(req, EngineError(f"HFEngine: generation failed: {type(e).__name__}: {e}"))
                batch = None
                with self._cond:
                    self._active = 0
                    self._cond.notify_all()

    @staticmethod
    def _requests_of(batch: Any) -> list[Request]:
        """The batch's rows and the requests whose prompts are still being prefilled."""
        return batch.requests + [r for p in batch.prefill for r in p.reqs]

    def _finish(self, batch: Any, i: int, reason: str) -> None:
        batch.done[i] = True
        req = batch.requests[i]
        self.stats.completed += 1
        bad = next((k for k, lp in enumerate(req.logprobs) if not math.isfinite(lp)), None)
        if bad is not None:  # NaN / inf weights (or a diverged update): named here, not deep in a Segment check
            self._resolve(req, NonFiniteLogprobError(
                f"model {self.source}: produced a non-finite log-probability ({req.logprobs[bad]}) at generated "
                f"token {bad}; its weights hold NaN or inf (a diverged update, a damaged file)"))
            return
        info = self.routing.completion_info(req) if self.routing is not None else {}
        self._resolve(req, Completion(list(req.tokens), list(req.logprobs), reason, info))

    def _rows_left(self, n: int) -> None:
        """`n` rows of the running batch finished (or were dropped): room for as many admissions."""
        with self._cond:
            self._active -= n
            self._cond.notify_all()

    @contextlib.contextmanager
    def _drained(self) -> Iterator[None]:
        """Wait until the running rows finished (admitting nothing new meanwhile), then hold the model: what
        runs inside sees no row in flight; waiting requests start after it."""
        with self._cond:
            self._draining = True  # the worker admits nothing new while set
            while self._active > 0 and self._worker is not None and self._worker.is_alive():
                self._cond.wait(timeout=0.1)
        try:
            with self._model_lock:  # never taken while holding _cond: the worker nests them the other way
                yield
        finally:
            with self._cond:
                self._draining = False
                self._cond.notify_all()
