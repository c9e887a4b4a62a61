"""Inference engines behind one protocol (memrl.engines.base): transformers (hf), vLLM, OpenAI-compatible HTTP.

`build_engine(EngineConfig, policy=None)` builds the engine a config names (train, eval and demo all use
it); each backend is imported only when asked for. `make_engine(kind, model, **kwargs)` is the keyword
form for scripts.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from memrl.engines.base import Completion, Engine, EngineError, SamplingParams
from memrl.engines.config import ENGINE_KINDS, EngineConfig, HFSection, OpenAISection, VLLMSection
from memrl.engines.hf import HFEngine
from memrl.engines.openai_http import OpenAIConfig, OpenAIEngine
from memrl.engines.vllm import VLLMConfig, VLLMEngine
from memrl.errors import UserError, weightless_hint

__all__ = ["ENGINE_KINDS", "Completion", "Engine", "EngineConfig", "EngineError", "HFSection", "OpenAISection",
           "SamplingParams", "VLLMSection", "build_engine", "make_engine"]


def build_engine(cfg: EngineConfig, policy: Any = None, tokenizer: Any = None, lora_rank: int = 0) -> Engine:
    """The engine `cfg` names. `policy` (a loaded model, with its `tokenizer`) is what the trainer trains:
    hf serves it directly (engine.hf.share_weights) or a copy of it; vllm / openai load `cfg.model`.
    `lora_rank` > 0: a vLLM engine is built with LoRA support for adapters of that rank (the trainer, with
    engine.vllm.lora_sync=adapter)."""
    if cfg.name == "hf":

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
        _check_weights(cfg.model)
        return HFEngine(cfg.model, tokenizer=tokenizer, device=h.device or "cpu", dtype=cfg.dtype,
                        attn_implementation=h.attn_implementation, **kw)
    if not cfg.model:
        raise ValueError(f"engine.model is empty: engine {cfg.name!r} needs a model directory")
    if cfg.name != "openai":  # openai reads only the tokenizer from engine.model
        _check_weights(cfg.model)
    if cfg.name in ("vllm", "vllm-cpu"):

        v = dataclasses.asdict(cfg.vllm)  # lora_sync is the trainer's: it passes lora_rank
        return VLLMEngine(VLLMConfig(model=cfg.model, dtype=cfg.dtype or "auto", seed=cfg.seed,
                                     max_num_seqs=cfg.max_batch_size, max_lora_rank=int(lora_rank), **v))
    if cfg.name == "openai":

        o = dataclasses.asdict(cfg.openai)
        o.pop("sync_dir")
        o.pop("lora_sync")
        o["model"] = o.pop("served_model")
        return OpenAIEngine(OpenAIConfig(tokenizer=cfg.model, max_concurrency=cfg.max_batch_size, **o),
                            tokenizer=tokenizer)
    raise ValueError(f"unknown engine kind {cfg.name!r}; known: {', '.join(ENGINE_KINDS)}")


def _check_weights(model: str) -> None:
    """A config-only directory (a verl checkpoint's huggingface/ folder) fails here, naming the conversion."""
    hint = weightless_hint(Path(model)) if Path(model).is_dir() else None
    if hint:
        raise UserError(f"engine.model={model}: {hint}")


def make_engine(kind: str, model: Any = None, **kwargs: Any) -> Engine:
    """An engine by name with keyword settings (scripts): "hf" -> HFEngine(model, **kwargs), "vllm" /
    "vllm-cpu" -> VLLMEngine(model=model, **kwargs), "openai" -> OpenAIEngine(tokenizer=model, **kwargs);
    for vllm / openai, `device` is ignored and `max_batch_size` means max_num_seqs / max_concurrency."""
    if kind == "hf":

        if model is None:
            raise ValueError("make_engine('hf'): pass the model directory or a loaded model")
        return HFEngine(model, **kwargs)
    if kind in ("vllm", "vllm-cpu"):

        kwargs.pop("device", None)
        if "max_batch_size" in kwargs:
            kwargs["max_num_seqs"] = kwargs.pop("max_batch_size")
        return VLLMEngine(model=str(model), **kwargs)
    if kind == "openai":

        kwargs.pop("device", None)
        if "max_batch_size" in kwargs:
            kwargs["max_concurrency"] = kwargs.pop("max_batch_size")
        return OpenAIEngine(OpenAIConfig(tokenizer=str(model) if model is not None else "", **kwargs))
    raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(ENGINE_KINDS)}")
