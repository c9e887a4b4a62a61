"""The one engine config (`engine.*` in `memrl train`, `memrl eval` and `memrl demo`).

    engine=vllm engine.max_batch_size=256 engine.vllm.gpu_memory_utilization=0.5
    engine=openai engine.openai.base_url=http://127.0.0.1:8000 engine.openai.timeout_s=120

Fields every kind reads sit at the top; each kind's own settings live in its sub-section and are
ignored by the other kinds. `memrl.engines.build_engine` turns an EngineConfig into an engine of the kind
`name` names (memrl.engines.registry). These are
the one place the engines' defaults are set: HFEngine's keywords, VLLMConfig (a VLLMSection) and
OpenAIConfig take theirs from here (tests/unit/test_config_defaults.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from memrl.config import MAX_COUNT, MAX_MB, MAX_PARALLEL, MAX_SECONDS, MAX_SEED, MAX_TOKENS, valid
from memrl.engines.registry import engine_kind, engine_names
from memrl.plugins import is_import_path

LORA_SYNCS = ("merged", "adapter")
"""How a LoRA policy reaches a vLLM engine in training (engine.vllm.lora_sync, engine.openai.lora_sync)."""
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_CACHES = ("padded", "slots")
"""How the hf engine keeps the batch's KV cache (engine.hf.kv_cache)."""
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
"""vLLM logprobs modes that give log-probabilities (its *_logits modes do not: memrl.engines.base's contract)."""


@dataclass
class HFSection:
    """The embedded transformers engine (memrl.engines.hf.HFEngine)."""

    device: str = ""
    """"cpu" or "cuda[:i]"; "" = the policy's device when training, else cpu."""
    max_wait_ms: float = valid(5.0, ge=0, le=MAX_SECONDS * 1000)
    """How long the first waiting request holds a batch open for others."""
    max_prefill_tokens: int = valid(32768, ge=1, le=MAX_TOKENS)
    """Padded tokens per prefill pass (bounds memory)."""
    attn_implementation: str | None = "sdpa"
    """transformers attention implementation when the engine loads the model itself."""
    deterministic: bool = True
    """Batch by waves (the requests of one event-loop turn), not by time: a wave is decoded alone (a later
    one waits until it is done) and its results come back together, so the same requests always meet the
    same batches: rollouts are bitwise reproducible and resume is exact, as long as nothing a rollout awaits
    between model calls runs in a thread or over the network (docs/CONTRACTS.md, determinism). False =
    continuous batching with a time window (max_wait_ms): higher throughput, batch-dependent float rounding.
    `memrl eval` defaults to false (memrl.eval.runner.EVAL_ENGINE_DEFAULTS); HFEngine built directly takes
    this default too."""
    kv_cache: str = valid("slots", choices=KV_CACHES)
    """slots (the default; the faster layout on the CPU, docs/results/engine.md): every row owns a slot of a
    preallocated cache; a row joins by writing its own slot and leaves by freeing it (the last row moves
    into the hole), the prompts admitted together are prefilled in batched passes, right padded, each row's
    own positions written to its slot (an identical prompt admitted together once), decode attends to each
    row's own length only | padded: one left-padded KV cache for the whole batch; rows that join or leave
    rebuild it (a copy of every row), prompts admitted together are prefilled as one padded batch (the
    layout of the demo tables recorded before 2026-11-28, and the one algorithm.routing_replay=r3 records).
    Greedy tokens agree on the tests' prompts; float rounding may differ."""
    prefix_cache_tokens: int | None = valid(None, ge=0, le=MAX_TOKENS)
    """kv_cache=slots: prompt tokens whose keys and values are kept so a later prompt that starts with the
    same tokens (in blocks of 16) computes only the rest; 0 = off, None = 16384 with slots. With
    deterministic waves the store is emptied at every wave, so a wave's numbers never depend on earlier
    ones (exact resume); a weight update empties it. Only slots has it: a value > 0 with padded is an error."""
    prefill_chunk_tokens: int = valid(0, ge=0, le=MAX_TOKENS)
    """kv_cache=slots with deterministic=false: the most prompt tokens prefilled between two decode steps of
    the running rows (vLLM's chunked prefill); a longer prompt, or more prompts admitted at once, are
    prefilled over several steps, and a row joins the decode batch once its whole prompt is in. 0 = off:
    every admitted prompt is prefilled whole before the next decode step. Greedy tokens equal the unchunked
    engine's on the tests' prompts (float rounding may differ). Refused with kv_cache=padded and with
    deterministic waves (a wave is decoded alone: no running rows wait while it prefills, and
    max_prefill_tokens already bounds its prefill's memory; docs/results/engine.md)."""
    compute_dtype: str | None = valid(None, choices=("float32", "bfloat16", "auto"))
    """bfloat16: the engine computes in bfloat16 (mixed precision, memrl.precision; logits cast to float32
    before sampling and log-probabilities): weights of its own are held in bfloat16 (engine.dtype is then
    bfloat16; a weight sync casts), shared weights (share_weights) are cast under autocast at every forward,
    which costs a decode step more than it saves on the CPU. On a CPU it needs bfloat16 instructions. None =
    the weights' dtype; training with model.compute_dtype=bfloat16 and this unset: bfloat16, on a copy of
    the policy (share_weights off; the run's log says so). auto: bfloat16 where the engine's device has
    bfloat16 instructions, else float32 (memrl.precision.resolve_compute_dtype; the log says which)."""
    share_weights: bool = True
    """Training only: serve the very module being trained (no copy; weight sync is a no-op). False = a
    copy of the policy, synced after every update."""

    def serving_policy(self, policy_compute_dtype: str | None) -> str | None:
        """The compute dtype when the engine serves a trained policy whose forwards compute in
        `policy_compute_dtype` (model.compute_dtype, resolved): this section's when set, else bfloat16 under a
        bfloat16 policy, else the weights' dtype (None). The one rule for the in-process engine and the Ray
        replicas."""
        if self.compute_dtype is not None:
            return self.compute_dtype
        return "bfloat16" if policy_compute_dtype == "bfloat16" else None

    def contradiction(self) -> str | None:
        """What two of these settings contradict (one line naming both), None when they agree: checked when
        the config loads (EngineConfig), so `memrl train` and `memrl eval` refuse it before any model loads."""
        if self.prefix_cache_tokens and self.kv_cache == "padded":
            return (f"engine.hf.prefix_cache_tokens={self.prefix_cache_tokens} needs engine.hf.kv_cache=slots (the "
                    "padded cache has no prefix cache); set kv_cache=slots or prefix_cache_tokens=0")
        if self.prefill_chunk_tokens and self.kv_cache == "padded":
            return (f"engine.hf.prefill_chunk_tokens={self.prefill_chunk_tokens} needs engine.hf.kv_cache=slots (the "
                    "padded cache prefills admitted prompts as one batch); set kv_cache=slots or prefill_chunk_tokens=0")
        if self.prefill_chunk_tokens and self.deterministic:
            return (f"engine.hf.prefill_chunk_tokens={self.prefill_chunk_tokens} needs engine.hf.deterministic=false "
                    "(a deterministic wave is decoded alone, so no running rows wait while it prefills); set "
                    "deterministic=false or prefill_chunk_tokens=0")
        return None


@dataclass
class VLLMSection:
    """The in-process vLLM engine (memrl.engines.vllm.VLLMEngine; names follow vLLM's engine arguments)."""

    max_model_len: int | None = valid(None, ge=1, le=MAX_TOKENS)
    """Prompt + completion token limit; None = the model's own."""
    gpu_memory_utilization: float = valid(0.9, gt=0, le=1)
    """Fraction of GPU memory for weights + KV cache (on CPU: of host memory, unless kv_cache_gib is set)."""
    kv_cache_gib: float | None = valid(None, gt=0, le=MAX_MB)
    """KV cache size in GiB (vLLM's kv_cache_memory_bytes). On CPU, VLLM_CPU_KVCACHE_SPACE (whole GiB)
    overrides it when set. None = derive from gpu_memory_utilization."""
    enforce_eager: bool = False
    """Skip torch.compile / CUDA graphs: faster start, slower decode."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes."""
    enable_chunked_prefill: bool | None = None
    """None = vLLM's default, except on CPU, where it is off: vLLM 0.32's CPU runner crashes ("CPU
    Generator does not use offset") when a seeded request's prefill is split across steps."""
    tensor_parallel_size: int = valid(1, ge=1, le=MAX_PARALLEL)
    """GPUs one engine spans."""
    logprobs_mode: str = valid("processed_logprobs", choices=LOGPROBS_MODES)
    """"processed_logprobs" matches memrl's logprob convention (memrl.engines.base)."""
    enable_sleep_mode: bool = False
    """Allow sleep()/wake_up() (CUDA only)."""
    cpu_threads_bind: str | None = None
    """VLLM_CPU_OMP_THREADS_BIND for vLLM's CPU backend, e.g. "0-1"; None = every core this process may
    use (vLLM's own default keeps one core back). Ignored on GPU."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Any other vllm AsyncEngineArgs field, passed through unchanged."""
    lora_sync: str = valid("merged", choices=LORA_SYNCS)
    """Training with model.lora.rank > 0, in process (rollout.num_engines=0): merged = every sync loads the
    merged weights (W + scaling * B A; the engine needs no LoRA support) | adapter = the engine is built with
    vLLM's LoRA support (max_lora_rank from model.lora.rank) and every sync hands it the adapter (PEFT
    files) under a new LoRARequest. docs/guides/lora.md has the measurement behind the default."""


@dataclass
class OpenAISection:
    """An OpenAI-compatible server (memrl.engines.openai_http.OpenAIEngine); `engine.model` is the local
    tokenizer directory of the served model."""

    base_url: str = "http://127.0.0.1:8000"
    """Server root, with or without a trailing /v1."""
    served_model: str | None = None
    """Served model name sent in requests; None = the server's only model (api=chat: taken from the server's
    GET /v1/models, which vLLM 0.7-era chat servers need; a server listing several is an error naming this)."""
    api_key: str | None = None
    """Sent as a Bearer token; None = the variable api_key_env names. Prefer the variable: a key given here
    is redacted ("<redacted>") in every saved config (eval_config.json, config.yaml)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the key when api_key is None; "" = none."""
    server: str = valid("vllm", choices=("vllm", "sglang"))
    """vllm | sglang: which weight-reload endpoint weight syncs use."""
    api: str = valid("completions", choices=("completions", "chat"))
    """completions: /v1/completions with token ids in and out (training and eval) | chat:
    /v1/chat/completions with the prompt's messages, for servers that only have it (MemAgent's
    serve/llm070.py); eval only: token ids and logprobs are used when the server returns them, else the
    reply text is tokenized and logprobs are unavailable; training refuses it up front."""
    vllm_reload_method: str = "memrl_load_weights"
    """Worker method a weight sync calls through vLLM's /collective_rpc (see OpenAIConfig)."""
    timeout_s: float = valid(600.0, gt=0, le=MAX_SECONDS)
    """Per-request read timeout."""
    connect_timeout_s: float = valid(10.0, gt=0, le=MAX_SECONDS)
    """Connection timeout."""
    max_retries: int = valid(3, ge=0, le=MAX_COUNT)
    """Retries after a connection error, timeout or 5xx."""
    backoff_s: float = valid(0.5, ge=0, le=MAX_SECONDS)
    """First retry delay; doubled per retry."""
    sync_dir: str = ""
    """Training: directory the policy is saved to for the server to reload (must be readable by the
    server); "" = <out_dir>/engine_weights."""
    lora_sync: str = valid("merged", choices=LORA_SYNCS)
    """Training with model.lora.rank > 0 against a vLLM server: merged = the server reloads the merged
    directory (sync_dir) | adapter = the adapter is written to sync_dir/adapter-<version> and loaded by
    POST /v1/load_lora_adapter (server started with --enable-lora, --max-lora-rank >= model.lora.rank and
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); requests name it as their model, the previous one is unloaded."""


@dataclass
class EngineConfig:
    """Which engine serves the model, and its settings (kind-specific ones in hf / vllm / openai)."""

    name: str = valid("hf", choices=engine_names, import_paths=True)
    """Engine kind: hf (transformers, in process), vllm, vllm-cpu, openai (a running server), one registered
    with memrl.engines.registry.register_engine, or the import path of an EngineKind."""
    model: str = ""
    """Model directory (HuggingFace format). Training: "" = the policy (model.path, or the checkpoint a
    resumed run starts from). openai: the local tokenizer directory."""
    max_batch_size: int = valid(64, ge=1, le=MAX_COUNT)
    """Sequences decoded together (hf max_batch_size, vLLM max_num_seqs, openai requests in flight)."""
    dtype: str | None = valid(None, choices=DTYPES)
    """Weights dtype name; None = the policy's when sharing, else float32 on CPU / bfloat16 on CUDA (hf),
    "auto" (vLLM)."""
    seed: int = valid(0, ge=0, le=MAX_SEED)
    """Seed for requests that carry none of their own."""
    hf: HFSection = field(default_factory=HFSection)
    vllm: VLLMSection = field(default_factory=VLLMSection)
    openai: OpenAISection = field(default_factory=OpenAISection)

    def __post_init__(self) -> None:
        if self.name == "local":
            raise ValueError("engine.name 'local' was removed: use hf (it serves the trained module itself, "
                             "engine.hf.share_weights=true)")
        if is_import_path(self.name):
            engine_kind(self.name)  # a path that names no EngineKind fails here, by name
        elif self.name not in engine_names():
            raise ValueError(f"engine.name {self.name!r} is not one of {', '.join(engine_names())}")
        if self.max_batch_size < 1:
            raise ValueError(f"engine.max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.openai.api not in ("completions", "chat"):
            raise ValueError(f"engine.openai.api {self.openai.api!r} is not completions or chat")
        if not self.openai.base_url.startswith(("http://", "https://")):
            raise ValueError(f"engine.openai.base_url={self.openai.base_url!r} must start with http:// or https://")
        problem = self.hf.contradiction()
        if problem:
            raise ValueError(problem)

    def for_replica(self, kind: str, model: str, dtype: str | None, gpus: float, policy_compute_dtype: str | None,
                    gpu_memory_utilization: float, sleeps: bool) -> EngineConfig:
        """This section as every Ray replica runs it: kind `kind` loading `model` in `dtype`, on "cuda" when it
        has `gpus` > 0 else "cpu"; hf: a copy of the policy (share_weights off) computing in
        HFSection.serving_policy's dtype; vllm: `gpu_memory_utilization`, and sleep mode when `sleeps` (or
        engine.vllm.enable_sleep_mode)."""
        hf = replace(self.hf, device="cuda" if gpus > 0 else "cpu", share_weights=False,
                     compute_dtype=self.hf.serving_policy(policy_compute_dtype))
        vllm = replace(self.vllm, gpu_memory_utilization=gpu_memory_utilization,
                       enable_sleep_mode=self.vllm.enable_sleep_mode or sleeps)
        return replace(self, name=kind, model=model, dtype=dtype, hf=hf, vllm=vllm)
