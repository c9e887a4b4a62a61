"""LoRA for `memrl train` and `memrl train-sft` (`model.lora.*`), through PEFT.

- `wrap` puts PEFT LoRA adapters on the loaded base model (the adapter's random init seeded, so two runs
  start alike), or loads a checkpoint's adapter for an exact resume; only the adapter trains.
- Checkpoints hold the adapter in PEFT's format (adapter_config.json + adapter_model.safetensors; the base
  model is `model.path`) and, with `model.lora.save_merged`, a merged HuggingFace directory in `merged/`.
- Engines never need PEFT: an engine sharing the trained module (engine.hf.share_weights) serves the
  PeftModel itself; every other engine gets merged weights, W + scaling * B A, under the base model's
  HuggingFace names (`merged_state`), or a merged directory (`save_merged_dir`: an OpenAI-compatible
  server's sync_dir).

peft is optional (`pip install 'memrl[lora]'`); rank 0 (the default) never imports it.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from memrl.config import MAX_COEF, ConfigError, valid
from memrl.quiet import hf_progress_off, peft_rename_warning_off
from memrl.training.checkpoints.checkpoint import ADAPTER_WEIGHTS

MERGED_DIR = "merged"


@dataclass
class LoraSection:
    """LoRA adapters instead of full fine-tuning (PEFT); rank 0 = off (full fine-tuning)."""

    rank: int = valid(0, ge=0, le=4096, note="0 = off")
    """LoRA rank r of every adapted matrix; 0 = full fine-tuning."""
    alpha: float = valid(16.0, gt=0, le=MAX_COEF)
    """Scaling numerator: the update is (alpha / rank) * B A."""
    dropout: float = valid(0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"])
    """Module names (suffixes) that get adapters; the default is every linear layer of a Qwen2 / Llama
    decoder layer (attention and MLP)."""
    save_merged: bool = False
    """Checkpoints (and train-sft's output) also hold a merged HuggingFace directory in `merged/`."""


def enabled(section: Any) -> bool:
    """Whether a ModelSection (or LoraSection) asks for LoRA."""
    lora = getattr(section, "lora", section)
    return lora is not None and int(getattr(lora, "rank", 0) or 0) > 0


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _peft() -> Any:
    try:
        import peft  # noqa: PLC0415
    except ImportError as e:
        raise ConfigError("model.lora.rank > 0 needs peft: pip install 'memrl[lora]'") from e
    return peft


def wrap(model: Any, lora: LoraSection, seed: int = 0, adapter_from: str | os.PathLike | None = None,
         gradient_checkpointing: bool = False) -> Any:
    """`model` with LoRA adapters (a PeftModel; the base weights frozen). The adapter's init draws from
    its own generator seeded by `seed` (the global RNG is left as it was). `adapter_from`: a directory
    holding adapter_model.safetensors (a checkpoint) whose adapter weights are loaded exactly."""
    peft = _peft()
    conf = peft.LoraConfig(r=int(lora.rank), lora_alpha=float(lora.alpha), lora_dropout=float(lora.dropout),
                           target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    dev = next(model.parameters()).device
    devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        try:
            with peft_rename_warning_off():
                pm = peft.get_peft_model(model, conf)
        except ValueError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"model.lora.target_modules={list(lora.target_modules)}: {first}") from e
    if gradient_checkpointing:
        pm.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    if adapter_from is not None:
        load_adapter(pm, adapter_from)
    return pm


def load_adapter(model: Any, path: str | os.PathLike) -> None:
    """Copy a saved adapter (PEFT's adapter_model.safetensors) into `model`'s adapter; every tensor must
    match a parameter of the adapter, and every adapter parameter must be there."""
    from peft import set_peft_model_state_dict  # noqa: PLC0415

    f = Path(path) / ADAPTER_WEIGHTS
    if not f.is_file():
        raise ConfigError(f"{f} is missing: the checkpoint holds no LoRA adapter (was it trained with "
                          "model.lora.rank=0?)")
    state = load_file(str(f))
    res = set_peft_model_state_dict(model, state)
    missing = [k for k in getattr(res, "missing_keys", []) if "lora_" in k]
    unexpected = list(getattr(res, "unexpected_keys", []))
    if missing or unexpected:
        raise ConfigError(f"{f}: does not fit model.lora ({len(missing)} adapter tensor(s) missing, e.g. "
                          f"{missing[:2]}; {len(unexpected)} unknown, e.g. {unexpected[:2]}); resume with the "
                          "rank and target_modules it was trained with")


def first_forward(model: Any, token: int = 0) -> None:
    """One no-grad forward of a single token through a freshly FSDP2-sharded LoRA policy, with the adapter
    switched on (eval mode: no dropout, no RNG drawn). FSDP2 fixes each layer group's gradient dtypes at
    the first forward from the parameters that require grad then; PEFT's disable_adapter (the KL
    reference, `BaseReference`) switches the adapter's requires_grad off while it runs, so were the
    reference's forward the first, no group would cast its gradients to the reduce dtype (with
    trainer.fsdp_bf16: "attempting to assign a gradient with dtype BFloat16 to a tensor with grad_dtype
    Float"). Changes no weight and no number the update computes."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([[token]], device=next(model.parameters()).device))
    finally:
        model.train(was_training)


class BaseReference:
    """The KL reference of a LoRA policy: the policy's own module with its adapters switched off. PEFT
    starts B at 0, so that is the initial policy, with no second copy of the weights (the base stays
    frozen, also across resumes). Called like a model (memrl.training.update.policy.token_logprobs); runs in eval
    mode as a separately loaded reference would."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def forward(self, input_ids: Any = None, attention_mask: Any = None, logits_to_keep: int = 0, **kw: Any) -> Any:
        if logits_to_keep:
            kw["logits_to_keep"] = logits_to_keep
        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                return self.model(input_ids=input_ids, attention_mask=attention_mask, **kw)
        finally:
            self.model.train(was_training)

    __call__ = forward


PEFT_PREFIX = "base_model.model."
"""Where a PeftModel's state dict puts the base model's HuggingFace names."""


def scaling(section: Any) -> float:
    """alpha / rank of a ModelSection or LoraSection (PEFT's scaling without rsLoRA)."""
    lora = getattr(section, "lora", section)
    return float(lora.alpha) / int(lora.rank)


def merge_state_dict(state: dict[str, Any], scale: float, adapter: str = "default") -> dict[str, Any]:
    """A PeftModel's state dict (live, or gathered from FSDP shards) -> the base model's HuggingFace state
    dict with every adapter merged: W + (B @ A) * scale, computed in the adapter's dtype as PEFT's merge
    does (Linear layers; fan_in_fan_out does not occur in Qwen2 / Llama). A state dict without adapter
    tensors comes back as it is."""
    if not any(".lora_" in k for k in state):
        return state
    out: dict[str, Any] = {}
    for k, v in state.items():
        if ".lora_" in k:
            continue
        key = k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k
        if ".base_layer." in k and k.endswith(".weight"):
            owner = k.rsplit(".base_layer.", 1)[0]
            a, b = state.get(f"{owner}.lora_A.{adapter}.weight"), state.get(f"{owner}.lora_B.{adapter}.weight")
            if a is not None and b is not None:
                v = v + ((b @ a) * scale).to(v.dtype)
        out[key.replace(".base_layer.", ".")] = v
    return out


def merged_state(model: Any) -> dict[str, Any]:
    """The model's weights under the base model's HuggingFace names with the adapter merged in, without
    changing `model`. Plain models: their state dict."""
    if not is_peft(model):
        return model.state_dict()
    conf = model.peft_config["default"]
    return merge_state_dict(model.state_dict(), float(conf.lora_alpha) / int(conf.r))


def engine_state(state: dict[str, Any], section: Any) -> dict[str, Any]:
    """What engines get from a (gathered) policy state dict: with LoRA (`section` = model) the merged
    weights under HuggingFace names, else `state` itself."""
    return merge_state_dict(state, scaling(section)) if enabled(section) and state else state


def save_merged_dir(model: Any, tokenizer: Any, path: str | os.PathLike,
                    state: dict[str, Any] | None = None) -> Path:
    """A loadable HuggingFace directory of the merged weights (config, safetensors, tokenizer) at `path`.
    `state`: the model's state dict gathered from FSDP2 shards (the live module's own holds only this
    rank's shards); None: the live module's."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    target = model.get_base_model() if is_peft(model) else model
    if state is None:
        state = merged_state(model)
    elif is_peft(model):
        conf = model.peft_config["default"]
        state = merge_state_dict(state, float(conf.lora_alpha) / int(conf.r))
    if getattr(target.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)

    tmp = d / ".model.safetensors.tmp"
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, d / "model.safetensors")
    target.config.save_pretrained(d)
    gen = getattr(target, "generation_config", None)
    if gen is not None:
        with hf_progress_off():
            gen.save_pretrained(d)
    if tokenizer is not None:
        tokenizer.save_pretrained(d)
    return d


class CheckpointModel:
    """What `checkpoint.save_checkpoint` needs of a model (`save_pretrained`) for a LoRA policy: PEFT's
    adapter files, plus the merged HuggingFace directory in `merged/` when `save_merged`. `state`: the
    PeftModel's state dict gathered from FSDP2 shards (rank 0 of several writes the full adapter from it,
    under the names world size 1 writes); None: the live module's."""

    def __init__(self, model: Any, tokenizer: Any, save_merged: bool, state: dict[str, Any] | None = None) -> None:
        self.model, self.tokenizer, self.save_merged, self.state = model, tokenizer, save_merged, state

    def save_pretrained(self, path: Any, **kw: Any) -> None:
        extra = {} if self.state is None else {"state_dict": dict(self.state)}
        with peft_rename_warning_off():
            self.model.save_pretrained(path, safe_serialization=True, **extra)
        if self.save_merged:
            save_merged_dir(self.model, self.tokenizer, Path(path) / MERGED_DIR, self.state)


def checkpoint_model(model: Any, tokenizer: Any, section: Any, state: dict[str, Any] | None = None) -> Any:
    """`model` itself, or for a LoRA policy the CheckpointModel that saves its adapter (`state`: gathered
    from FSDP2 shards, see CheckpointModel)."""
    if not is_peft(model):
        return model
    save_merged = bool(getattr(getattr(section, "lora", section), "save_merged", False))
    return CheckpointModel(model, tokenizer, save_merged, state)


def base_source(section: Any, start: str | os.PathLike | None) -> str:
    """Where the policy's weights load from: the checkpoint `start`, or with LoRA always the base
    (`model.path`; the checkpoint holds only the adapter)."""
    if start is None or enabled(section):
        return str(section.path)
    return str(start)


def engine_policy(model: Any, share_weights: bool) -> Any:
    """The module an in-process engine is built from: the trained module when it shares it, else for a
    LoRA policy a plain merged copy (the engine then takes merged state dicts and needs no PEFT)."""
    if share_weights or not is_peft(model):
        return model
    return copy.deepcopy(model).merge_and_unload()


def engine_weights(workers: Any, engine: Any) -> Any:
    """What the in-process engine's update_weights gets: the live module's state dict when the engine
    shares that module (a no-op), else the workers' weights for engines (merged with LoRA)."""
    model = getattr(workers, "model", None)
    if model is not None and getattr(engine, "model", None) is model:
        return model.state_dict()
    return workers.weights_for_engines()


def save_engine_dir(model: Any, tokenizer: Any, path: str | os.PathLike) -> None:
    """The directory a server reloads from (engine.openai.sync_dir): save_pretrained of a plain model,
    the merged HuggingFace directory of a LoRA policy."""
    if is_peft(model):
        save_merged_dir(model, tokenizer, path)
        return
    with hf_progress_off():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
