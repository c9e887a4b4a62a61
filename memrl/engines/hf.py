"""The transformers engine: an embedded HuggingFace causal LM behind the Engine protocol, with batching.

Concurrent `generate` calls go into a queue; one worker thread runs a continuous-batching decode loop:
waiting requests are prefilled and merged into the running batch between decode steps, every row keeps
its own SamplingParams, and finished rows leave the batch. How the batch's KV cache is kept is
`engine.hf.kv_cache`: `padded` (the default) prefills an admission together, left padded, into one padded
cache; `slots` gives every row a slot of a preallocated cache, prefills an admission's distinct prompts in
right-padded passes grouped by their stored prefix (a block prefix cache, `prefix_cache_tokens`), and can
prefill to a token budget between decode steps (`prefill_chunk_tokens`). A batch opens when
`max_batch_size` requests wait or the oldest has waited `max_wait_ms`. The loop is written out here
(no `model.generate`) so that per-row sampling, seeds and logprobs follow memrl's conventions:

- logprob of a sampled token = log_softmax(logits / T)[token], T = temperature (1 when greedy), taken
  before top-k / top-p truncation (memrl.engines.base), computed in float32 from the model's logits;
- a request with a seed samples from its own torch.Generator (one uniform draw per token, inverse CDF), so
  its tokens do not depend on which other requests share the batch (up to float rounding of the logits);
- stop tokens = the request's stop_token_ids plus the tokenizer's eos; a stop token ends the completion
  and is included in it (finish "stop"); max_tokens ends it with finish "length".

Weight updates (`update_weights`) wait until the running rows finish, so no completion mixes weights.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer
from transformers.cache_utils import Cache

from memrl.engines.base import Completion, EngineError, NonFiniteLogprobError, SamplingParams
from memrl.engines.config import KV_CACHES, EngineConfig, HFSection
from memrl.engines.hf_cache import PrefixStore, SlotKV, cache_kwarg, cache_layer_class
from memrl.engines.hf_sampling import sample_rows
from memrl.engines.hf_weights import load_state_dict, strip_wrappers
from memrl.engines.weight_transfer import WeightTransfer, receive_all
from memrl.model_open import open_model
from memrl.precision import autocast, check_compute_dtype, torch_dtype

PREFIX_CACHE_TOKENS = 16384
"""engine.hf.prefix_cache_tokens=None with kv_cache=slots."""

_ENGINE, _HF = EngineConfig(), HFSection()
"""The section defaults HFEngine's keywords take (engine.* and engine.hf.*): one place sets them."""

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


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
class _Request:
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


def _settle_on_loop(loop: asyncio.AbstractEventLoop, results: list[tuple[_Request, Any]]) -> None:
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


class _Batch:
    """The running rows: their requests, the shared left-padded KV cache, mask, next positions and inputs."""

    def __init__(self, requests: list[_Request], cache: Any, mask: torch.Tensor, next_pos: torch.Tensor,
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
    reqs: list[_Request]
    cache: Any = None
    done: int = 0


class _SlotBatch:
    """The running rows of engine.hf.kv_cache=slots: row r owns slot r of `kv`, holding its lens[r] tokens."""

    def __init__(self, kv: SlotKV, requests: list[_Request] | None = None, last: torch.Tensor | None = None,
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


class HFEngine:
    """A transformers causal LM served with a micro-batcher and a hand-written KV-cache decoding loop.

    Every keyword's default is the `engine` section's (memrl.engines.config: EngineConfig and its HFSection,
    the one place they are set), so `HFEngine(path)` is the engine `memrl train` builds: deterministic wave
    batching, seed 0. Pass `deterministic=False` for continuous batching (what `memrl eval` selects).

    model_or_path: a HuggingFace directory (tokenizer loaded from it too) or a loaded PreTrainedModel.
    device: "cpu" or "cuda[:i]" ("" = cpu); dtype: torch dtype or name (default float32 on CPU, bfloat16 on CUDA).
    max_batch_size: most rows decoded together; max_wait_ms: how long the first waiting request holds the
    batch open for others; max_prefill_tokens: padded tokens per prefill pass (bounds memory).
    seed: seeds the generator of requests that carry no seed of their own (None = a random seed).
    share_weights: serve `model_or_path` (a loaded module) itself, on its own device and dtype, with no
    copy: the trainer's policy. `update_weights` with tensors that are that module's own is then a no-op.
    prefix_cache_tokens: slots only: prompt tokens kept for reuse by prompts with the same leading tokens
    (0 = off, None = PREFIX_CACHE_TOKENS with slots): engine.hf.prefix_cache_tokens.
    kv_cache: "padded" (one left-padded cache rebuilt when rows join or leave) or "slots" (every row owns a
    slot of a preallocated cache; an admission's prompts prefilled in right-padded passes, each row's own
    positions written to its slot): engine.hf.kv_cache.
    compute_dtype: "bfloat16" = mixed precision: an engine with weights of its own holds them in bfloat16
    (whatever `dtype` says; weight updates are cast); one sharing the policy's float32 weights runs its
    forwards under autocast. None = the weights' dtype: engine.hf.compute_dtype.
    prefill_chunk_tokens: slots with deterministic=False only: the most prompt tokens prefilled between two
    decode steps (0 = off: admitted prompts are prefilled whole): engine.hf.prefill_chunk_tokens.
    deterministic: batch by waves instead of by time, so the same requests always meet the same batches
    (bitwise-reproducible rollouts, exact resume): the requests one event-loop turn submits form a wave,
    a wave is decoded without admitting later requests, and its completions are all handed back together.
    """

    def __init__(
        self,
        model_or_path: Any,
        tokenizer: Any = None,
        device: str = _HF.device,
        dtype: torch.dtype | str | None = _ENGINE.dtype,
        max_batch_size: int = _ENGINE.max_batch_size,
        max_wait_ms: float = _HF.max_wait_ms,
        max_prefill_tokens: int = _HF.max_prefill_tokens,
        seed: int | None = _ENGINE.seed,
        attn_implementation: str | None = _HF.attn_implementation,
        share_weights: bool = False,
        deterministic: bool = _HF.deterministic,
        kv_cache: str = _HF.kv_cache,
        prefix_cache_tokens: int | None = _HF.prefix_cache_tokens,
        prefill_chunk_tokens: int = _HF.prefill_chunk_tokens,
        compute_dtype: str | None = _HF.compute_dtype,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"HFEngine.max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_ms < 0:
            raise ValueError(f"HFEngine.max_wait_ms must be >= 0, got {max_wait_ms}")
        if kv_cache not in KV_CACHES:
            raise ValueError(f"HFEngine.kv_cache must be one of {', '.join(KV_CACHES)}, got {kv_cache!r}")
        self.kv_cache = kv_cache
        if prefix_cache_tokens is not None and prefix_cache_tokens < 0:
            raise ValueError(f"HFEngine.prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
        if kv_cache == "padded" and prefix_cache_tokens:
            raise ValueError("HFEngine.prefix_cache_tokens needs kv_cache='slots' (the padded cache has no prefix "
                             f"cache), got prefix_cache_tokens={prefix_cache_tokens}")
        if prefill_chunk_tokens < 0:
            raise ValueError(f"HFEngine.prefill_chunk_tokens must be >= 0, got {prefill_chunk_tokens}")
        if prefill_chunk_tokens and kv_cache == "padded":
            raise ValueError("engine.hf.prefill_chunk_tokens needs engine.hf.kv_cache=slots (the padded cache "
                             f"prefills admitted prompts as one batch), got prefill_chunk_tokens={prefill_chunk_tokens}")
        if prefill_chunk_tokens and deterministic:
            raise ValueError("engine.hf.prefill_chunk_tokens needs engine.hf.deterministic=false (a wave is "
                             f"prefilled whole), got prefill_chunk_tokens={prefill_chunk_tokens}")
        self.prefill_chunk_tokens = prefill_chunk_tokens
        if prefix_cache_tokens is None:
            prefix_cache_tokens = PREFIX_CACHE_TOKENS if kv_cache == "slots" else 0
        self._prefix = PrefixStore(prefix_cache_tokens) if prefix_cache_tokens else None
        self._prefix_wave = -1  # deterministic: the wave whose prompts the prefix store holds
        self.share_weights = share_weights
        self.source = "(the policy being trained)"
        """What error messages call the model: its directory when loaded from one."""
        if share_weights:
            if not isinstance(model_or_path, torch.nn.Module):
                raise EngineError("HFEngine(share_weights=True) needs a loaded model, not a path")
            param = next(model_or_path.parameters())
            self.device, self.dtype = param.device, param.dtype
            self.model, self.tokenizer = self._shared(model_or_path, tokenizer)
        else:
            self.device = torch.device(device or "cpu")
            if self.device.type == "cuda" and not torch.cuda.is_available():
                raise EngineError("HFEngine: device 'cuda' requested but torch.cuda.is_available() is False")
            # Mixed precision on weights of its own: held in the compute dtype (cast once per load or sync),
            # not cast at every forward as autocast would (a decode step's cost on the CPU).
            self.dtype = self._resolve_dtype(compute_dtype if compute_dtype == "bfloat16" else dtype)
            self.model, self.tokenizer = self._load(model_or_path, tokenizer, attn_implementation)
        check_compute_dtype(compute_dtype, str(self.device), "engine.hf.compute_dtype")
        self.compute_dtype = torch_dtype(compute_dtype)
        """Mixed precision: the dtype forwards compute in (None = the weights' dtype); over shared weights of
        another dtype, under autocast."""
        self.max_batch_size = max_batch_size
        self.deterministic = deterministic
        self.max_wait_s = 0.0 if deterministic else max_wait_ms / 1000.0
        self.max_prefill_tokens = max(1, max_prefill_tokens)
        cfg = self.model.config
        self.vocab_size = int(getattr(cfg, "vocab_size", 0) or self.model.get_output_embeddings().weight.shape[0])
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 1 << 30)
        self.num_layers = int(cfg.num_hidden_layers)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            raise EngineError("HFEngine: the tokenizer has no eos_token_id; every completion needs a stop token")
        self.eos_token_id = int(eos)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_id
        self.stats = EngineStats()
        self._rng = torch.Generator(device="cpu")
        self._rng.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
        self._layer_cls = cache_layer_class()
        self._cache_kw = cache_kwarg(self.model)  # "cache" (transformers 5.24), else "past_key_values"
        self.routing: Any = None  # memrl.training.routing.EngineRouting: MoE experts recorded per request (r3)

        self._cond = threading.Condition()
        self._pending: collections.deque[_Request] = collections.deque()
        self._active = 0  # rows in the running batch (read under _cond)
        self._draining = False  # a weight update waits for the running rows to finish
        self._closed = False
        self._worker: threading.Thread | None = None
        self._model_lock = threading.Lock()
        self._seq = 0  # submission order of requests
        self._waves: dict[asyncio.AbstractEventLoop, list[_Request]] = {}  # deterministic: the forming wave
        self._held: list[tuple[_Request, Completion | BaseException]] = []  # deterministic: the running wave's results
        self._wave_count = 0  # deterministic: waves submitted so far (a request's `wave` is its wave's number)
        self._running_wave = 0  # deterministic: the wave whose rows the worker decodes (0 = none yet)
        self._last_decode: float | None = None  # when the last decode step ended, while rows run

    # ------------------------------------------------------------------ loading

    def _resolve_dtype(self, dtype: torch.dtype | str | None) -> torch.dtype:
        if dtype is None or dtype == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else torch.float32
        if isinstance(dtype, torch.dtype):
            return dtype
        if dtype not in _DTYPES:
            raise ValueError(f"HFEngine: unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
        return _DTYPES[dtype]

    @staticmethod
    def _tokenizer_of(model: Any, tokenizer: Any) -> Any:
        if tokenizer is not None:
            return tokenizer

        name = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
        if not name or not Path(name).is_dir():
            raise EngineError("HFEngine: pass tokenizer= when giving a model object without a local path")
        return AutoTokenizer.from_pretrained(name)

    def _shared(self, model: Any, tokenizer: Any) -> tuple[Any, Any]:
        """The caller's module as is: no dtype / device move, and its train/eval mode stays the caller's."""
        return model, self._tokenizer_of(model, tokenizer)

    def _load(self, model_or_path: Any, tokenizer: Any, attn: str | None) -> tuple[Any, Any]:
        if isinstance(model_or_path, str | os.PathLike):
            path = Path(model_or_path)
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"HFEngine: {path} is not a HuggingFace model directory (no config.json)")
            kwargs: dict[str, Any] = {"dtype": self.dtype}
            if attn:
                kwargs["attn_implementation"] = attn
            model = open_model(path, "engine.model", **kwargs)  # one line naming the directory, not a traceback
            self.source = str(path)
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(path)
        else:
            model = model_or_path
            tokenizer = self._tokenizer_of(model, tokenizer)
            model = model.to(dtype=self.dtype)
        model = model.to(self.device).eval()
        return model, tokenizer

    # ------------------------------------------------------------------ public API

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

    def _submit(self, reqs: list[_Request]) -> None:
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

    def update_weights(self, weights: Mapping[str, Any] | str | os.PathLike | torch.nn.Module) -> None:
        """Copy new weights into the model in place: a state dict (HF parameter names), a HuggingFace
        directory / .safetensors file, or a module. Waits for running rows to finish; waiting requests
        start after the update. Tensors that already are the model's own (shared storage) are skipped, so
        syncing the module an engine shares costs nothing."""
        state = self._read_weights(weights)
        if self._all_shared(state):
            return
        with self._cond:
            self._draining = True  # the worker admits nothing new while set
            while self._active > 0 and self._worker is not None and self._worker.is_alive():
                self._cond.wait(timeout=0.1)
        try:
            with self._model_lock:  # never taken while holding _cond: the worker nests them the other way
                if self._prefix is not None:
                    self._prefix.clear()  # keys and values of the old weights
                self._copy_weights(state)
            self.stats.weight_updates += 1
        finally:
            with self._cond:
                self._draining = False
                self._cond.notify_all()

    def busy_seconds(self) -> tuple[float, int]:
        """(seconds the worker has spent generating so far, 1 replica): the trainer's engine idle share."""
        return self.stats.generate_seconds, 1

    transfer_members = 1
    """Processes this engine adds to a weight-transfer group (memrl.engines.weight_transfer)."""

    def init_weight_transfer(self, spec: Any, first_rank: int) -> None:
        """Join the trainer's broadcast group as rank `first_rank` (blocks until every member joined)."""
        device = self.device if spec.backend == "nccl" else None
        self._transfer = WeightTransfer(spec, first_rank, device)

    def receive_weights(self) -> None:
        """Receive the trainer's next broadcast and load it (update_weights); call while it sends."""
        transfer = getattr(self, "_transfer", None)
        if transfer is None:
            raise EngineError("HFEngine.receive_weights before init_weight_transfer")
        self.update_weights(receive_all(transfer))

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

    # ------------------------------------------------------------------ requests

    def _make_request(self, prompt_ids: list[int], sampling: SamplingParams) -> _Request:
        if not isinstance(sampling, SamplingParams):
            raise EngineError(f"HFEngine.generate: sampling must be SamplingParams, got {type(sampling).__name__}")
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise EngineError("HFEngine.generate: prompt_ids is empty; a prompt needs at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineError(f"HFEngine.generate: prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        room = self.max_positions - len(ids)
        if room < 1:
            raise EngineError(
                f"HFEngine.generate: prompt has {len(ids)} tokens; the model allows {self.max_positions} positions"
            )
        gen = None
        if not sampling.greedy and sampling.seed is not None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(int(sampling.seed))
        loop = asyncio.get_running_loop()
        return _Request(
            prompt_ids=ids,
            sampling=sampling,
            stop_ids=frozenset(sampling.stop_token_ids) | {self.eos_token_id},
            max_new=min(sampling.max_tokens, room),
            loop=loop,
            future=loop.create_future(),
            generator=gen,
            submitted=time.monotonic(),
        )

    def _resolve(self, req: _Request, result: Completion | BaseException) -> None:
        """Hand `result` to the caller's loop (deterministic: held until the whole wave is done)."""
        if self.deterministic:
            with self._cond:
                self._held.append((req, result))
            return
        _settle_on_loop(req.loop, [(req, result)])

    def _release_held(self) -> None:
        """Deterministic mode: hand back a finished wave's results at once, in submission order."""
        with self._cond:
            held, self._held = self._held, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Request, Completion | BaseException]]] = {}
        for req, result in sorted(held, key=lambda x: x[0].seq):
            by_loop.setdefault(req.loop, []).append((req, result))
        for loop, results in by_loop.items():
            _settle_on_loop(loop, results)

    # ------------------------------------------------------------------ worker

    def _ensure_worker(self) -> None:
        with self._cond:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._worker_main, name="memrl-hf-engine", daemon=True)
                self._worker.start()

    def _take_admissions(self, batch: _Batch | None) -> list[_Request]:
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

    def _pop_admissions(self, free: int) -> list[_Request]:
        out: list[_Request] = []
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
        batch: _Batch | None = None
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
    def _requests_of(batch: Any) -> list[_Request]:
        """The batch's rows and the requests whose prompts are still being prefilled."""
        return batch.requests + [r for p in batch.prefill for r in p.reqs]

    # ------------------------------------------------------------------ model work (worker thread only)

    def _new_cache(self) -> Any:
        return Cache(layers=[self._layer_cls() for _ in range(self.num_layers)])

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any,
                 last: list[int] | None = None, rows: list[_Request] | None = None) -> torch.Tensor:
        """Float32 logits [B, V] of each row's last position, or of position last[b] for row b; `rows`: the
        rows' requests, for the routing recorder (padded cache)."""
        keep = sorted(set(last)) if last is not None else []
        record = self.routing.forward(rows, input_ids, mask, pos) if self.routing and rows else nullcontext()
        with autocast(self.device, self.compute_dtype, self.dtype), record:
            out = self.model(
                input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=True,
                logits_to_keep=1 if last is None else torch.tensor(keep, dtype=torch.long, device=input_ids.device),
                **{self._cache_kw: cache},
            )
        self.stats.forward_calls += 1
        self.stats.batch_sizes[int(input_ids.shape[0])] += 1
        if last is None:
            return out.logits[:, -1, :].float()
        col = torch.tensor([keep.index(k) for k in last], dtype=torch.long, device=out.logits.device)
        return out.logits[torch.arange(len(last), device=out.logits.device), col].float()

    def _admit(self, batch: Any, reqs: list[_Request]) -> Any:
        if self.prefill_chunk_tokens:
            return self._queue_slots(batch, reqs)
        if self.kv_cache == "slots":
            return self._admit_slots(batch, reqs)
        t0 = time.perf_counter()
        out = self._admit_padded(batch, reqs)
        self.stats.prefill_s += time.perf_counter() - t0
        return out

    def _admit_padded(self, batch: _Batch | None, reqs: list[_Request]) -> _Batch:
        """Prefill `reqs` together (left padded), sample their first tokens, merge them into the batch."""
        dev = self.device
        n, t = len(reqs), max(len(r.prompt_ids) for r in reqs)
        ids = torch.full((n, t), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, t), dtype=torch.long)
        for i, r in enumerate(reqs):
            k = len(r.prompt_ids)
            ids[i, t - k :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, t - k :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        cache = self._new_cache()
        padded = bool((mask == 0).any())
        headroom = max(r.max_new for r in reqs) + 1
        for layer in cache.layers:
            layer.pad_valid = mask.bool() if padded else None
            layer.min_capacity = t + headroom
        logits = self._forward(ids, mask, pos, cache, rows=reqs)
        for layer in cache.layers:
            layer.pad_valid = None
        self.stats.prefill_calls += 1
        self.stats.prompt_tokens += sum(len(r.prompt_ids) for r in reqs)
        self.stats.prefill_tokens += n * t
        self.stats.padded_positions += n * t - sum(len(r.prompt_ids) for r in reqs)
        new = _Batch(reqs, cache, mask, mask.sum(-1), torch.zeros(n, dtype=torch.long, device=dev))
        self._sample_into(new, logits)
        if batch is None or len(batch) == 0:
            return new
        t0 = time.perf_counter()
        out = self._merge(batch, new)
        self.stats.cache_s += time.perf_counter() - t0
        return out

    def _decode_step(self, batch: Any) -> None:
        now = time.perf_counter()
        if self._last_decode is not None:
            self.stats.max_decode_gap_s = max(self.stats.max_decode_gap_s, now - self._last_decode)
        try:
            self._decode_step_layout(batch)
        finally:
            self._last_decode = time.perf_counter()

    def _decode_step_layout(self, batch: Any) -> None:
        if self.kv_cache == "slots":
            self._decode_step_slots(batch)
            return
        live = [i for i, d in enumerate(batch.done) if not d]
        if not live:
            return
        t0 = time.perf_counter()
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        logits = self._forward(batch.last[:, None], batch.mask, batch.next_pos[:, None], batch.cache,
                               rows=batch.requests)
        batch.next_pos = batch.next_pos + 1
        self.stats.decode_steps += 1
        self.stats.attended_positions += batch.mask.numel()
        self.stats.padded_positions += batch.mask.numel() - int(batch.mask.sum())
        self.stats.decode_s += time.perf_counter() - t0
        self._sample_into(batch, logits)

    def _sample_into(self, batch: Any, logits: torch.Tensor) -> None:
        """Sample one token per live row from float32 logits [B, V]; record token, logprob, finish."""
        t0 = time.perf_counter()
        try:
            self._sample_rows(batch, logits)
        finally:
            self.stats.sample_s += time.perf_counter() - t0

    def _sample_rows(self, batch: Any, logits: torch.Tensor) -> None:
        rows = [i for i, d in enumerate(batch.done) if not d]
        idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
        sub = logits.index_select(0, idx) if len(rows) < logits.shape[0] else logits
        params = [batch.requests[i].sampling for i in rows]
        temps = torch.tensor([p.logprob_temperature for p in params], dtype=torch.float32, device=sub.device)
        scaled = sub / temps[:, None]
        logp = torch.log_softmax(scaled, dim=-1)
        tokens = torch.argmax(sub, dim=-1)
        sampled = [j for j, p in enumerate(params) if not p.greedy]
        if sampled:
            sidx = torch.tensor(sampled, dtype=torch.long, device=sub.device)
            u = torch.tensor([self._uniform(batch.requests[rows[j]]) for j in sampled], dtype=torch.float64)
            u = u.clamp_(max=1 - 2**-24).to(sub.device, torch.float32)  # stays < 1 in float32
            choice = sample_rows(
                logp.index_select(0, sidx), u,
                [params[j].top_k for j in sampled], [params[j].top_p for j in sampled],
            )
            tokens = tokens.index_copy(0, sidx, choice)
        chosen_lp = logp.gather(1, tokens[:, None]).squeeze(1)
        tok_list, lp_list = tokens.tolist(), chosen_lp.tolist()
        new_last = batch.last.clone()
        for j, i in enumerate(rows):
            req = batch.requests[i]
            if req.future.cancelled():  # the caller gave up: stop spending compute on the row
                batch.done[i] = True
                continue
            tok = tok_list[j]
            req.tokens.append(tok)
            req.logprobs.append(lp_list[j])
            self.stats.generated_tokens += 1
            if len(req.tokens) == 1:
                wait = time.monotonic() - req.submitted
                self.stats.first_tokens += 1
                self.stats.first_token_wait_s += wait
                self.stats.max_first_token_s = max(self.stats.max_first_token_s, wait)
            if tok in req.stop_ids:
                self._finish(batch, i, "stop")
            elif len(req.tokens) >= req.max_new:
                self._finish(batch, i, "length")
        new_last.index_copy_(0, idx, tokens)
        batch.last = new_last

    def _uniform(self, req: _Request) -> float:
        gen = req.generator if req.generator is not None else self._rng
        return float(torch.rand((), generator=gen, dtype=torch.float64))

    def _finish(self, batch: _Batch, i: int, reason: str) -> None:
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

    def _retire(self, batch: Any) -> Any:
        if self.kv_cache == "slots":
            self._compact(batch)
            return batch
        t0 = time.perf_counter()
        try:
            return self._retire_padded(batch)
        finally:
            self.stats.cache_s += time.perf_counter() - t0

    def _retire_padded(self, batch: _Batch) -> _Batch:
        """Drop finished rows once they are a quarter of the batch (or all of it); trim all-padding columns."""
        ndone = sum(batch.done)
        if ndone == 0:
            return batch
        if ndone < len(batch) and ndone * 4 < len(batch):
            return batch
        keep = [i for i, d in enumerate(batch.done) if not d]
        with self._cond:
            self._active -= ndone
            self._cond.notify_all()
        if not keep:
            return _Batch([], None, batch.mask[:0], batch.next_pos[:0], batch.last[:0])
        return self._select(batch, keep)

    def _select(self, batch: _Batch, keep: list[int]) -> _Batch:
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = batch.mask.index_select(0, idx)
        first = int((mask.sum(0) > 0).nonzero()[0]) if mask.numel() else 0
        mask = mask[:, first:]
        for layer in batch.cache.layers:
            k = layer.keys.index_select(0, idx)[:, :, first:]
            v = layer.values.index_select(0, idx)[:, :, first:]
            layer.set_contents(k, v, extra=self._headroom(batch, keep))
            self.stats.cache_copy_bytes += 2 * k.numel() * k.element_size()
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
            with self._cond:
                self._active -= dropped
                self._cond.notify_all()
        if not keep:
            return new
        t_old, t_new = old.mask.shape[1], new.mask.shape[1]
        t = max(t_old, t_new)
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)

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
            self.stats.cache_copy_bytes += 2 * k[:, :, first:].numel() * k.element_size()
        out = _Batch(
            [old.requests[i] for i in keep] + new.requests,
            old.cache,
            mask,
            torch.cat([old.next_pos.index_select(0, idx), new.next_pos]),
            torch.cat([old.last.index_select(0, idx), new.last]),
        )
        out.done = [False] * len(keep) + list(new.done)
        return out

    # ------------------------------------------------------------------ engine.hf.kv_cache=slots

    def _admit_slots(self, batch: _SlotBatch | None, reqs: list[_Request]) -> _SlotBatch:
        """Prefill the distinct prompts of `reqs` in batched passes (right padded, see `_prefill_group`), write
        each one's keys and values into the slots of the requests that sent it, sample their first tokens,
        append them to the batch.

        Two rounds, so that prompts of one admission still share their common start through the prefix cache:
        first the prompts with no stored prefix whose first block starts no earlier prompt of the round
        (the leaders), then, once the leaders are stored, the rest, each after its longest stored prefix. In
        each round prompts with the same stored prefix length are prefilled together."""
        if batch is None:
            batch = _SlotBatch(SlotKV(self.num_layers))
        self._compact(batch)
        if self._prefix is not None and self.deterministic and reqs[0].wave != self._prefix_wave:
            self._prefix.clear()  # a wave's numbers depend on that wave alone (exact resume)
            self._prefix_wave = reqs[0].wave
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
                hit, prefix_kv = self._prefix.lookup(tuple(reqs[j].prompt_ids)) if self._prefix is not None else (0, [])
                groups.setdefault(hit, []).append((j, prefix_kv))
            for hit, rows in groups.items():
                rows.sort(key=lambda row: (len(reqs[row[0]].prompt_ids), row[0]))  # least padding
                start = 0
                while start < len(rows):  # the longest suffix of a pass x its rows within max_prefill_tokens
                    stop = start + 1
                    while stop < len(rows) and (stop + 1 - start) * (
                            len(reqs[rows[stop][0]].prompt_ids) - hit) <= self.max_prefill_tokens:
                        stop += 1
                    self._prefill_group(reqs, rows[start:stop], hit, slots, logits_of)
                    start = stop
        for j, r in enumerate(reqs):  # the same prompt admitted together: computed once, its keys and values copied
            if first[tuple(r.prompt_ids)] != j:
                kv.copy_row(base + first[tuple(r.prompt_ids)], base + j, len(r.prompt_ids))
        self.stats.prompt_tokens += sum(len(r.prompt_ids) for r in reqs)
        self.stats.cache_copy_bytes += kv.copied_bytes - copied
        self.stats.prefill_s += time.perf_counter() - t0
        new = _SlotBatch(kv, list(reqs), torch.zeros(len(reqs), dtype=torch.long, device=self.device),
                         [len(r.prompt_ids) for r in reqs])
        self._sample_into(new, torch.cat([logits_of[first[tuple(r.prompt_ids)]] for r in reqs]))
        batch.requests += new.requests
        batch.lens += new.lens
        batch.done += new.done
        batch.last = torch.cat([batch.last.to(self.device), new.last])
        return batch

    def _leaders(self, reqs: list[_Request], distinct: list[int]) -> tuple[list[int], list[int]]:
        """(prompts prefilled in the first round, the rest): a prompt goes second when the prefix cache holds
        a start of it already, or when its first block starts a leader that the cache will store (it then
        reuses at least that block)."""
        if self._prefix is None:
            return distinct, []
        b, leaders, rest, heads = self._prefix.block, [], [], set()
        for j in distinct:
            key = tuple(reqs[j].prompt_ids)
            if (len(key) > b and key[:b] in heads) or self._prefix.lookup(key)[0]:
                rest.append(j)
                continue
            leaders.append(j)
            if b <= len(key) <= self._prefix.max_tokens:
                heads.add(key[:b])
        return leaders, rest

    def _prefill_group(self, reqs: list[_Request], rows: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]],
                       hit: int, slots: tuple, logits_of: dict[int, torch.Tensor]) -> None:
        """One prefill pass over the prompts reqs[j] for (j, stored prefix) in `rows`, all after a stored prefix
        of `hit` tokens: the rest of each prompt right padded to the longest (with causal attention a real
        token never attends to the padding after it, so no mask is needed), every row's logits taken at its
        last real token and only its real positions written into its slot (and the prefix cache)."""
        kv, base, used, need, total_rows = slots
        lens = [len(reqs[j].prompt_ids) for j, _ in rows]
        n, width = len(rows), max(lens) - hit
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        for i, (j, _) in enumerate(rows):
            ids[i, : lens[i] - hit] = torch.tensor(reqs[j].prompt_ids[hit:], dtype=torch.long)
        cache = self._new_cache()
        for layer in cache.layers:
            layer.min_capacity = hit + width
        if hit:
            for li, layer in enumerate(cache.layers):
                keys = torch.cat([prefix_kv[li][0] for _, prefix_kv in rows]) if n > 1 else rows[0][1][li][0]
                values = torch.cat([prefix_kv[li][1] for _, prefix_kv in rows]) if n > 1 else rows[0][1][li][1]
                layer.set_contents(keys, values, extra=width)
        pos = torch.arange(hit, hit + width, device=self.device)[None, :].repeat(n, 1)
        mask = torch.ones((n, hit + width), dtype=torch.long, device=self.device)
        logits = self._forward(ids.to(self.device), mask, pos, cache,
                               last=None if n == 1 else [k - hit - 1 for k in lens])
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens += n * width
        self.stats.padded_positions += n * width - sum(k - hit for k in lens)
        self.stats.prefix_hit_tokens += n * hit
        kv.ensure(total_rows, need, base, used, cache.layers[0].keys, self.max_batch_size)
        for i, (j, _) in enumerate(rows):
            own = [(layer.keys[i : i + 1, :, : lens[i]], layer.values[i : i + 1, :, : lens[i]])
                   for layer in cache.layers]
            if self._prefix is not None:  # a batch's rows are stored apart (evicting one frees its memory)
                self._prefix.add(tuple(reqs[j].prompt_ids), own if n == 1 else [(k.clone(), v.clone()) for k, v in own])
            kv.write_row(base + j, own)
            logits_of[j] = logits[i : i + 1]

    def _queue_slots(self, batch: _SlotBatch | None, reqs: list[_Request]) -> _SlotBatch:
        """prefill_chunk_tokens: queue the admitted prompts for prefilling (a prompt already queued is
        prefilled once for every request that sent it)."""
        if batch is None:
            batch = _SlotBatch(SlotKV(self.num_layers))
        for r in reqs:
            key = tuple(r.prompt_ids)
            same = next((p for p in batch.prefill if p.key == key), None)
            if same is not None:
                same.reqs.append(r)
            else:
                batch.prefill.append(_Partial(key, [r]))
        return batch

    def _prefill_chunks(self, batch: _SlotBatch) -> None:
        """Prefill the queued prompts, first come first, until prefill_chunk_tokens prompt tokens are computed
        (a prompt's prefix-cache hit is not computed, so it does not count); a prompt cut by the budget goes on
        from there at the next step. Prompts completed here join the batch with their first token."""
        t0 = time.perf_counter()
        budget = self.prefill_chunk_tokens
        ready: list[tuple[_Partial, torch.Tensor]] = []
        i = 0  # completed prompts stay queued until they joined (a failure reaches their callers)
        while budget > 0 and i < len(batch.prefill):
            p = batch.prefill[i]
            if all(r.future.cancelled() for r in p.reqs):  # every caller gave up: nothing to compute
                batch.prefill.pop(i)
                with self._cond:
                    self._active -= len(p.reqs)
                    self._cond.notify_all()
                continue
            n = len(p.key)
            if p.cache is None:  # its first chunk: start after the longest stored prefix
                hit, prefix_kv = self._prefix.lookup(p.key) if self._prefix is not None else (0, [])
                p.cache = self._new_cache()
                for layer in p.cache.layers:
                    layer.min_capacity = n
                for layer, (k, v) in zip(p.cache.layers, prefix_kv, strict=False):
                    layer.set_contents(k, v, extra=n - hit)
                p.done = hit
                self.stats.prefix_hit_tokens += hit
            end = min(n, p.done + budget)
            ids = torch.tensor([p.key[p.done : end]], dtype=torch.long, device=self.device)
            pos = torch.arange(p.done, end, device=self.device)[None, :]
            mask = torch.ones((1, end), dtype=torch.long, device=self.device)
            logits = self._forward(ids, mask, pos, p.cache)
            self.stats.prefill_calls += 1
            self.stats.prefill_tokens += end - p.done
            budget -= end - p.done
            p.done = end
            if end < n:
                self.stats.prefill_chunks += 1
                continue
            i += 1
            if self._prefix is not None:
                self._prefix.add(p.key, [(layer.keys, layer.values) for layer in p.cache.layers])
            ready.append((p, logits))
        self.stats.prefill_s += time.perf_counter() - t0
        if ready:
            self._join_slots(batch, ready)
            del batch.prefill[:i]

    def _join_slots(self, batch: _SlotBatch, ready: list[tuple[_Partial, torch.Tensor]]) -> None:
        """Write the wholly prefilled prompts into slots after the running rows and sample their first tokens."""
        self._compact(batch)
        t0 = time.perf_counter()
        kv, base = batch.kv, len(batch)
        copied = kv.copied_bytes
        reqs = [r for p, _ in ready for r in p.reqs]
        need = max(len(q.prompt_ids) + q.max_new + 1 for q in reqs)
        kv.ensure(base + len(reqs), need, base, max(batch.lens, default=0), ready[0][0].cache.layers[0].keys,
                  self.max_batch_size)
        row, logits_rows = base, []
        for p, logits in ready:
            kv.write_row(row, [(layer.keys, layer.values) for layer in p.cache.layers])
            for extra in range(1, len(p.reqs)):  # the same prompt sent again: its keys and values copied
                kv.copy_row(row, row + extra, len(p.key))
            logits_rows += [logits] * len(p.reqs)
            row += len(p.reqs)
            p.cache = None
        self.stats.prompt_tokens += sum(len(r.prompt_ids) for r in reqs)
        self.stats.cache_copy_bytes += kv.copied_bytes - copied
        self.stats.cache_s += time.perf_counter() - t0
        new = _SlotBatch(kv, reqs, torch.zeros(len(reqs), dtype=torch.long, device=self.device),
                         [len(r.prompt_ids) for r in reqs])
        self._sample_into(new, torch.cat(logits_rows))
        batch.requests += new.requests
        batch.lens += new.lens
        batch.done += new.done
        batch.last = torch.cat([batch.last.to(self.device), new.last])

    def _decode_step_slots(self, batch: _SlotBatch) -> None:
        self._compact(batch)
        if not len(batch):
            return
        t0 = time.perf_counter()
        rows = len(batch)
        width = max(batch.lens) + 1
        lens = torch.tensor(batch.lens, dtype=torch.long, device=self.device)
        mask = (torch.arange(width, device=self.device)[None, :] <= lens[:, None])[:, None, None, :]
        cache = batch.kv.step_cache(rows, lens, width)
        logits = self._forward(batch.last[:, None], mask, lens[:, None], cache)
        batch.lens = [n + 1 for n in batch.lens]
        self.stats.decode_steps += 1
        self.stats.attended_positions += rows * width
        self.stats.padded_positions += rows * width - sum(batch.lens)
        self.stats.decode_s += time.perf_counter() - t0
        self._sample_into(batch, logits)

    def _compact(self, batch: _SlotBatch) -> None:
        """Drop finished rows: each hole takes the last live row (one row's copy); the others stay put."""
        ndone = sum(batch.done)
        if not ndone:
            return
        t0 = time.perf_counter()
        with self._cond:
            self._active -= ndone
            self._cond.notify_all()
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
        self.stats.cache_copy_bytes += batch.kv.copied_bytes - before
        self.stats.cache_s += time.perf_counter() - t0

    # ------------------------------------------------------------------ weights

    def _read_weights(self, weights: Any) -> Mapping[str, torch.Tensor]:
        if isinstance(weights, torch.nn.Module):
            return weights.state_dict()
        if isinstance(weights, Mapping):
            return weights
        if isinstance(weights, str | os.PathLike):
            return load_state_dict(Path(weights))
        raise EngineError(
            f"HFEngine.update_weights: expected a state dict, a module or a path, got {type(weights).__name__}"
        )

    def _all_shared(self, state: Mapping[str, torch.Tensor]) -> bool:
        """True when every tensor of `state` is stored where the model's tensor of that name is."""
        own = self.model.state_dict()
        return bool(state) and all(
            (key := strip_wrappers(name)) in own and own[key].data_ptr() == t.data_ptr()
            and own[key].shape == t.shape
            for name, t in state.items()
        )

    def _copy_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        own = dict(self.model.named_parameters(remove_duplicate=False))
        own.update(dict(self.model.named_buffers(remove_duplicate=False)))
        if not state:
            raise EngineError("HFEngine.update_weights: the state dict is empty")
        resolved: list[tuple[torch.Tensor, torch.Tensor]] = []
        unknown = []
        for name, tensor in state.items():
            key = strip_wrappers(name)
            if key not in own:
                unknown.append(name)
                continue
            target = own[key]
            if tuple(target.shape) != tuple(tensor.shape):
                raise EngineError(
                    f"HFEngine.update_weights: {name} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(target.shape)}"
                )
            resolved.append((target, tensor))
        if unknown:
            raise EngineError(
                f"HFEngine.update_weights: {len(unknown)} name(s) not in the model, e.g. {unknown[:3]}"
            )
        with torch.no_grad():
            for target, tensor in resolved:
                target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
