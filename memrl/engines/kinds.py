"""The built-in engine kinds (memrl.engines.registry): transformers in process (hf), vLLM in process (vllm,
vllm-cpu) and an OpenAI-compatible server (openai), each built from its own section of `engine` and
declaring what it can do. What is particular to one kind lives here, not in the code that uses engines."""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path
from typing import Any

from memrl.engines.config import EngineConfig
from memrl.engines.hf import HFEngine
from memrl.engines.openai_http import OpenAIConfig, OpenAIEngine
from memrl.engines.registry import EngineKind
from memrl.engines.vllm import VLLMConfig, VLLMEngine
from memrl.errors import UserError, weightless_hint

log = logging.getLogger(__name__)


def check_weights(model: str) -> None:
    """A config-only directory (a verl checkpoint's huggingface/ folder) fails here, naming the conversion."""
    hint = weightless_hint(Path(model)) if Path(model).is_dir() else None
    if hint:
        raise UserError(f"engine.model={model}: {hint}")


def _model_dir(cfg: EngineConfig) -> str:
    if not cfg.model:
        raise ValueError(f"engine.model is empty: engine {cfg.name!r} needs a model directory")
    return cfg.model


# ---------------------------------------------------------------- hf


def _build_hf(cfg: EngineConfig, policy: Any = None, tokenizer: Any = None, lora_rank: int = 0) -> HFEngine:
    """Transformers in process (HFEngine): serves `policy` itself (engine.hf.share_weights) or a copy of it,
    else loads engine.model."""
    h = cfg.hf
    kw: dict[str, Any] = {"max_batch_size": cfg.max_batch_size, "max_wait_ms": h.max_wait_ms,
                          "max_prefill_tokens": h.max_prefill_tokens, "seed": cfg.seed,
                          "deterministic": h.deterministic, "kv_cache": h.kv_cache,
                          "prefix_cache_tokens": h.prefix_cache_tokens,
                          "prefill_chunk_tokens": h.prefill_chunk_tokens, "compute_dtype": h.compute_dtype}
    if policy is not None:
        if h.share_weights:
            return HFEngine(policy, tokenizer=tokenizer, share_weights=True, **kw)

        device = h.device or str(next(policy.parameters()).device)
        return HFEngine(copy.deepcopy(policy), tokenizer=tokenizer, device=device, dtype=cfg.dtype, **kw)
    if not cfg.model:
        raise ValueError("engine.model is empty: give the model directory (--model DIR or engine.model=DIR)")
    check_weights(cfg.model)
    return HFEngine(cfg.model, tokenizer=tokenizer, device=h.device or "cpu", dtype=cfg.dtype,
                    attn_implementation=h.attn_implementation, **kw)


def _hf_for_policy(cfg: EngineConfig, compute_dtype: str | None) -> EngineConfig:
    if cfg.hf.compute_dtype is None and cfg.hf.serving_policy(compute_dtype) == "bfloat16":
        # Mixed precision: the engine decodes on a bfloat16 copy of the policy, synced after every update (the
        # shared float32 module under autocast costs a decode step more than it saves on the CPU).
        log.info("model.compute_dtype=bfloat16: the hf engine serves a bfloat16 copy of the policy, synced after "
                 "every update (engine.hf.compute_dtype unset)")
        return dataclasses.replace(cfg, hf=dataclasses.replace(cfg.hf, compute_dtype="bfloat16", share_weights=False))
    return cfg


def _hf_async_problem(cfg: EngineConfig, k: int) -> str | None:
    if cfg.hf.share_weights:
        return (f"rollout.max_staleness={k} needs engine.hf.share_weights=false (or Ray replicas, rollout.num_engines "
                ">= 1): an engine that shares the trained module would sample from weights the update is changing")
    return None


def _hf_routing_problem(cfg: EngineConfig) -> str | None:
    if cfg.hf.kv_cache != "padded":
        return (f"engine.hf.kv_cache={cfg.hf.kv_cache} (r3 records the padded cache's forwards; set "
                "engine.hf.kv_cache=padded)")
    return None


HF = EngineKind(
    "hf", _build_hf, section="hf", serves_policy=True, replica="hf",
    shares_policy=lambda cfg: bool(cfg.hf.share_weights), for_policy=_hf_for_policy,
    async_problem=_hf_async_problem, routing_problem=_hf_routing_problem,
    describe=lambda cfg: "hf (in process, engine.hf.share_weights=" + str(cfg.hf.share_weights).lower() + ")",
)


# ---------------------------------------------------------------- vllm, vllm-cpu


def _build_vllm(cfg: EngineConfig, policy: Any = None, tokenizer: Any = None, lora_rank: int = 0) -> VLLMEngine:
    """vLLM in process (VLLMEngine) loading engine.model; `lora_rank` > 0 builds it with LoRA support
    (engine.vllm.lora_sync=adapter)."""
    check_weights(_model_dir(cfg))
    v = dataclasses.asdict(cfg.vllm)  # lora_sync is the trainer's: it passes lora_rank
    return VLLMEngine(VLLMConfig(model=cfg.model, dtype=cfg.dtype or "auto", seed=cfg.seed,
                                 max_num_seqs=cfg.max_batch_size, max_lora_rank=int(lora_rank), **v))


def _vllm_async_problem(cfg: EngineConfig, k: int) -> str | None:
    return (f"rollout.max_staleness={k} with the in-process {cfg.name} engine: put vLLM in Ray replicas "
            "(rollout.num_engines >= 1, rollout.engine=vllm), where it samples while the trainer updates")


def _vllm_adapter_problem(cfg: EngineConfig, field: str, rank: int) -> str | None:
    if rank > 512:
        return f"{field}=adapter: model.lora.rank={rank} is above vLLM's largest max_lora_rank 512"
    return None


VLLM = EngineKind("vllm", _build_vllm, section="vllm", replica="vllm", replica_transfer=True, replica_sleeps=True,
                  adapters=True,
                  async_problem=_vllm_async_problem, adapter_problem=_vllm_adapter_problem)
VLLM_CPU = dataclasses.replace(VLLM, name="vllm-cpu")


# ---------------------------------------------------------------- openai


def _build_openai(cfg: EngineConfig, policy: Any = None, tokenizer: Any = None, lora_rank: int = 0) -> OpenAIEngine:
    """A client of a running OpenAI-compatible server (OpenAIEngine); engine.model is the local tokenizer
    directory of the served model."""
    _model_dir(cfg)
    o = dataclasses.asdict(cfg.openai)
    o.pop("sync_dir")
    o.pop("lora_sync")
    o["model"] = o.pop("served_model")
    return OpenAIEngine(OpenAIConfig(tokenizer=cfg.model, max_concurrency=cfg.max_batch_size, **o),
                        tokenizer=tokenizer)


def _openai_train_problem(cfg: EngineConfig) -> str | None:
    if cfg.openai.api == "chat":
        return ("engine.openai.api=chat cannot train: RL needs the generated token ids and their sampling "
                "logprobs for the exact prompt tokens, and /v1/chat/completions renders its own prompt and "
                "returns ids and logprobs only as optional extras; serve /v1/completions and set "
                "engine.openai.api=completions")
    return None


def _openai_adapter_problem(cfg: EngineConfig, field: str, rank: int) -> str | None:
    if cfg.openai.server != "vllm":
        return f"{field}=adapter needs engine.openai.server=vllm (its /v1/load_lora_adapter), got {cfg.openai.server!r}"
    return None


OPENAI = EngineKind(
    "openai", _build_openai, section="openai", reads_weights=False, weights_by_directory=True, adapters=True,
    train_problem=_openai_train_problem, adapter_problem=_openai_adapter_problem,
    describe=lambda cfg: f"openai ({cfg.openai.base_url})",
)
