"""Inference engines behind one protocol (memrl.engines.base): transformers (hf), vLLM, OpenAI-compatible HTTP.

`build_engine(EngineConfig, policy=None)` is the one factory (train, eval, demo, scripts): it builds the
kind `engine.name` names (memrl.engines.registry: a registered kind or an import path) from the `engine`
section. What a kind can do is declared on its EngineKind (`engine_kind(name)`), never read from its name.
"""

from __future__ import annotations

from typing import Any

from memrl.engines.base import Completion, Engine, EngineError, SamplingParams
from memrl.engines.config import EngineConfig, HFSection, OpenAISection, VLLMSection
from memrl.engines.registry import EngineKind, engine_kind, engine_names, register_engine

__all__ = ["Completion", "Engine", "EngineConfig", "EngineError", "EngineKind", "HFSection", "OpenAISection",
           "SamplingParams", "VLLMSection", "build_engine", "engine_kind", "engine_names", "register_engine"]


def build_engine(cfg: EngineConfig, policy: Any = None, tokenizer: Any = None, lora_rank: int = 0) -> Engine:
    """The engine `cfg` names. `policy` (a loaded model, with its `tokenizer`) is what the trainer trains:
    a kind that serves the policy (hf) serves it directly (engine.hf.share_weights) or a copy of it; the
    others load `cfg.model`. `lora_rank` > 0: a vLLM engine is built with LoRA support for adapters of that
    rank (the trainer, with engine.vllm.lora_sync=adapter)."""
    return engine_kind(cfg.name).build(cfg, policy, tokenizer, lora_rank)
