"""Inference engines behind one protocol (memrl.engines.base): transformers (hf), vLLM, OpenAI-compatible HTTP.

`make_engine(kind, model, **kwargs)` builds one by name; each backend is imported only when asked for.
"""

from __future__ import annotations

from typing import Any

from memrl.engines.base import Completion, Engine, EngineError, SamplingParams

ENGINE_KINDS = ("hf", "vllm", "vllm-cpu", "openai")

__all__ = ["ENGINE_KINDS", "Completion", "Engine", "EngineError", "SamplingParams", "make_engine"]


def make_engine(kind: str, model: Any = None, **kwargs: Any) -> Engine:
    """An engine by name.

    - "hf": HFEngine(model, **kwargs) (model = HF directory or loaded model; device, dtype, max_batch_size...)
    - "vllm" / "vllm-cpu": VLLMEngine(model=model, ...); max_batch_size maps to max_num_seqs; device is
      chosen by the installed vLLM build and ignored here.
    - "openai": OpenAIEngine over a running server; model is the local tokenizer directory, base_url a
      keyword; max_batch_size maps to max_concurrency.
    """
    if kind == "hf":
        from memrl.engines.hf import HFEngine

        if model is None:
            raise ValueError("make_engine('hf'): pass the model directory or a loaded model")
        return HFEngine(model, **kwargs)
    if kind in ("vllm", "vllm-cpu"):
        from memrl.engines.vllm import VLLMEngine

        kwargs.pop("device", None)
        if "max_batch_size" in kwargs:
            kwargs["max_num_seqs"] = kwargs.pop("max_batch_size")
        return VLLMEngine(model=str(model), **kwargs)
    if kind == "openai":
        from memrl.engines.openai_http import OpenAIConfig, OpenAIEngine

        kwargs.pop("device", None)
        if "max_batch_size" in kwargs:
            kwargs["max_concurrency"] = kwargs.pop("max_batch_size")
        return OpenAIEngine(OpenAIConfig(tokenizer=str(model) if model is not None else "", **kwargs))
    raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(ENGINE_KINDS)}")
