"""What a demo's model must be, checked from its config before the first stage (`memrl demo`): the attention
shape transformers can build and run, and the RL stage's own needs of its policy model
(memrl.training.assemble.check_policy_model), so a setting the RL stage refuses never costs hours of SFT first.

A method's config says which model its first stage builds with a `policy_shape()` method (a
memrl.models.tiny.ModelPreset), or by a `model` section with a `preset()` (memrl.recipes.pipeline.ModelShape);
a config with neither is not checked before the RL stage checks it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from memrl.models.tiny import CHAT_TEMPLATE, QWEN3_CHAT_TEMPLATE, ModelPreset, model_config, shape_problem
from memrl.training.assemble import check_policy_model


def demo_shape_problem(hidden_size: int, num_heads: int, num_kv_heads: int, prefix: str = "") -> str | None:
    """memrl.models.tiny.shape_problem, and an odd head dimension (hidden_size / num_heads): rotary position
    embeddings turn each head's dimensions in pairs, so transformers fails on an odd one at the first forward,
    after the demo's setup work. None when the shape is sound."""
    problem = shape_problem(hidden_size, num_heads, num_kv_heads, prefix)
    if problem or num_heads < 1:
        return problem
    head_dim = hidden_size // num_heads
    if head_dim % 2:
        return (f"{prefix}hidden_size={hidden_size} / {prefix}num_heads={num_heads} gives an odd head dimension "
                f"({head_dim}); rotary position embeddings need an even one")
    return None


def policy_shape(cfg: Any) -> ModelPreset | None:
    """The shape (and arch) of the model a demo config's first stage builds: its `policy_shape()`, else its
    `model` section's `preset()`; None when the config says neither."""
    own = getattr(cfg, "policy_shape", None)
    if callable(own):
        return own()
    preset = getattr(getattr(cfg, "model", None), "preset", None)
    return preset() if callable(preset) else None


def check_policy(cfg: Any, tcfg: Any, wf_cfg: Any) -> None:
    """The RL stage's checks of its policy model (routing replay, the router loss, the thinking switch) on the
    model the demo config `cfg` will build (`policy_shape`): its transformers config and memrl's tiny models'
    chat template for its arch (Qwen3's thinking template for qwen3 / qwen3_moe, ChatML without a switch for
    qwen2). Raises what memrl.training.assemble.check_policy_model raises."""
    shape = policy_shape(cfg)
    if shape is None:
        return
    config = model_config(shape, shape.vocab_size, eos_token_id=0, pad_token_id=0)
    template = QWEN3_CHAT_TEMPLATE if shape.arch.startswith("qwen3") else CHAT_TEMPLATE
    check_policy_model(tcfg, wf_cfg, config, SimpleNamespace(chat_template=template),
                       f"the demo's model (a {shape.arch} it trains from scratch)")
