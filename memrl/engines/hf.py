"""The transformers engine: an embedded HuggingFace causal LM behind the Engine protocol, with batching.

Concurrent `generate` calls go into a queue; one worker thread runs a continuous-batching decode loop:
waiting requests are prefilled and merged into the running batch between decode steps, every row keeps
its own SamplingParams, and finished rows leave the batch. How the batch's KV cache is kept is
`engine.hf.kv_cache`: `padded` prefills an admission together, left padded, into one padded
cache; `slots` (the default) gives every row a slot of a preallocated cache, prefills an admission's distinct prompts in
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

The parts: the request queue, waves and worker thread are memrl.engines.hf_scheduler (HFEngine's base
class), the two KV-cache layouts memrl.engines.hf_layouts, the per-row sampler memrl.engines.hf_sampling;
this module loads the model, runs its forward and copies weights in.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer
from transformers.cache_utils import Cache

from memrl.engines.base import Capabilities, EngineError, SamplingParams
from memrl.engines.config import KV_CACHES, EngineConfig, HFSection
from memrl.engines.hf_cache import PrefixStore, cache_layer_class
from memrl.engines.hf_layouts import PaddedLayout, SlotLayout
from memrl.engines.hf_sampling import sample_into
from memrl.engines.hf_scheduler import Request, Scheduler
from memrl.engines.hf_weights import load_state_dict, strip_wrappers
from memrl.engines.weight_transfer import WeightTransfer, receive_all
from memrl.model_open import cache_kwarg, open_model
from memrl.precision import autocast, resolve_compute_dtype, torch_dtype

PREFIX_CACHE_TOKENS = 16384
"""engine.hf.prefix_cache_tokens=None with kv_cache=slots."""

_ENGINE, _HF = EngineConfig(), HFSection()
"""The section defaults HFEngine's keywords take (engine.* and engine.hf.*): one place sets them."""

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


class HFEngine(Scheduler):
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

    capabilities = Capabilities(weight_transfer=True, busy_accounting=True)

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
        self._layout = SlotLayout(self, self._prefix) if kv_cache == "slots" else PaddedLayout(self)
        self.share_weights = share_weights
        if share_weights:
            if not isinstance(model_or_path, torch.nn.Module):
                raise EngineError("HFEngine(share_weights=True) needs a loaded model, not a path")
            param = next(model_or_path.parameters())
            self.device, self.dtype = param.device, param.dtype
            compute_dtype = resolve_compute_dtype(compute_dtype, str(self.device), "engine.hf.compute_dtype")
            self.model, self.tokenizer = self._shared(model_or_path, tokenizer)
        else:
            self.device = torch.device(device or "cpu")
            if self.device.type == "cuda" and not torch.cuda.is_available():
                raise EngineError("HFEngine: device 'cuda' requested but torch.cuda.is_available() is False")
            compute_dtype = resolve_compute_dtype(compute_dtype, str(self.device), "engine.hf.compute_dtype")
            # Mixed precision on weights of its own: held in the compute dtype (cast once per load or sync),
            # not cast at every forward as autocast would (a decode step's cost on the CPU).
            self.dtype = self._resolve_dtype(compute_dtype if compute_dtype == "bfloat16" else dtype)
            self.model, self.tokenizer = self._load(model_or_path, tokenizer, attn_implementation)
        self.compute_dtype = torch_dtype(compute_dtype)
        """Mixed precision: the dtype forwards compute in (None = the weights' dtype); over shared weights of
        another dtype, under autocast."""
        Scheduler.__init__(self, max_batch_size, max_wait_ms, max_prefill_tokens, deterministic)
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
        self._rng = torch.Generator(device="cpu")
        self._rng.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
        self._layer_cls = cache_layer_class()
        self._cache_kw = cache_kwarg(self.model)  # "cache" (transformers 5.24), else "past_key_values"

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

    # ------------------------------------------------------------------ public API

    def update_weights(self, weights: Mapping[str, Any] | str | os.PathLike | torch.nn.Module) -> None:
        """Copy new weights into the model in place: a state dict (HF parameter names), a HuggingFace
        directory / .safetensors file, or a module. Waits for running rows to finish; waiting requests
        start after the update. Tensors that already are the model's own (shared storage) are skipped, so
        syncing the module an engine shares costs nothing."""
        state = self._read_weights(weights)
        if self._all_shared(state):
            return
        with self._drained():
            if self._prefix is not None:
                self._prefix.clear()  # keys and values of the old weights
            self._copy_weights(state)
            self.stats.weight_updates += 1

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

    # ------------------------------------------------------------------ requests and model work

    def _make_request(self, prompt_ids: list[int], sampling: SamplingParams) -> Request:
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
        return Request(
            prompt_ids=ids,
            sampling=sampling,
            stop_ids=frozenset(sampling.stop_token_ids) | {self.eos_token_id},
            max_new=min(sampling.max_tokens, room),
            loop=loop,
            future=loop.create_future(),
            generator=gen,
            submitted=time.monotonic(),
        )

    def _new_cache(self) -> Any:
        return Cache(layers=[self._layer_cls() for _ in range(self.num_layers)])

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any,
                 last: list[int] | None = None, rows: list[Request] | None = None) -> torch.Tensor:
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

    def _admit(self, batch: Any, reqs: list[Request]) -> Any:
        if self.prefill_chunk_tokens:
            return self._queue_slots(batch, reqs)
        return self._layout.admit(batch, reqs)

    def _admit_slots(self, batch: Any, reqs: list[Request]) -> Any:
        """kv_cache=slots: prefill `reqs` whole and add them to `batch` (memrl.engines.hf_layouts)."""
        return self._layout.admit(batch, reqs)

    def _queue_slots(self, batch: Any, reqs: list[Request]) -> Any:
        """prefill_chunk_tokens: queue `reqs` for prefilling between decode steps."""
        return self._layout.queue(batch, reqs)

    def _prefill_chunks(self, batch: Any) -> None:
        self._layout.prefill_chunks(batch)

    def _decode_step(self, batch: Any) -> None:
        now = time.perf_counter()
        if self._last_decode is not None:
            self.stats.max_decode_gap_s = max(self.stats.max_decode_gap_s, now - self._last_decode)
        try:
            self._layout.decode_step(batch)
        finally:
            self._last_decode = time.perf_counter()

    def _retire(self, batch: Any) -> Any:
        return self._layout.retire(batch)

    def _sample_into(self, batch: Any, logits: torch.Tensor) -> None:
        """Sample one token per live row from float32 logits [B, V]; record token, logprob, finish."""
        sample_into(batch, logits, self._rng, self.stats, self._finish)

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
