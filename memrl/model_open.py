"""The one place a user's HuggingFace model directory is opened (train, eval, and the commands that load a
model): transformers' refusals become one `UserError` naming the directory.

    model = open_model(path, "model.path", dtype=torch.float32)

- `model_config(path, key)`: config.json through AutoConfig; a `model_type` this transformers does not
  know, one without a causal-LM class, or values its config class refuses are named here (cheap: callers
  run it up front, before any data or weights load);
- `open_model(path, key, **kwargs)`: AutoModelForCausalLM.from_pretrained(path, **kwargs), refused when
  config.json does not describe the weights (a weight missing from the files, one the model has no place
  for, or one of another shape: transformers would initialize those at random, or raise "size mismatch"),
  and when a weight holds NaN or inf (a diverged or damaged checkpoint: refused before it generates).

- `cache_kwarg(model)`: the keyword under which a loaded model's forward takes its KV cache (the hf
  engine's decoding and the trainer's shared-prefix forwards both pass one).

The files themselves (config.json present, weights whole, a tokenizer) are checked earlier by
`memrl.errors.model_dir`; this module is what runs once transformers reads them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import logging as tf_logging

from memrl.errors import UserError
from memrl.quiet import hf_progress_off

try:
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # an older huggingface_hub: configs are not validated there
    StrictDataclassError = ValueError  # type: ignore[assignment,misc]

CONFIG_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError, AttributeError,
                                                   StrictDataclassError)
"""What AutoConfig raises for a config.json it cannot build (huggingface_hub's strict-dataclass validation
errors are not ValueErrors)."""


def _where(path: str | os.PathLike[str], key: str) -> str:
    return f"{key}={path}" if key else f"model directory {path}"


def _first_line(e: BaseException) -> str:
    """The innermost cause's first line (a validator's reason, not its wrapper's)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()


def model_config(path: str | os.PathLike[str], key: str = "") -> Any:
    """config.json of model directory `path` as transformers builds it; UserError naming `key`=path when its
    model_type is unknown to this transformers, has no causal-LM class, or its values are refused."""
    where = _where(path, key)
    try:
        model_type = json.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None  # memrl.errors.model_dir names a missing or broken config.json
    if isinstance(model_type, str) and model_type not in CONFIG_MAPPING_NAMES:
        raise UserError(f"{where}: config.json's model_type {model_type!r} is not a model type transformers "
                        f"{transformers.__version__} knows (a newer transformers, or a model of a known type such "
                        "as qwen2, qwen3, llama, is needed)")
    if isinstance(model_type, str) and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UserError(f"{where}: config.json's model_type {model_type!r} has no causal language model in "
                        f"transformers {transformers.__version__} (memrl needs a model that generates text)")
    try:
        return AutoConfig.from_pretrained(path)
    except CONFIG_ERRORS as e:
        raise UserError(f"{where}: config.json is not a valid {model_type or 'model'} config: {_first_line(e)}") from None


@contextlib.contextmanager
def _no_load_report() -> Iterator[None]:
    """transformers' load report (a table of missing / unexpected / mismatched weights) off: `open_model`
    refuses those cases in one line of its own."""
    before = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    try:
        yield
    finally:
        tf_logging.set_verbosity(before)


def _shape(s: Any) -> str:
    return "[" + ", ".join(str(int(d)) for d in s) + "]"


def open_model(path: str | os.PathLike[str], key: str = "", **kwargs: Any) -> Any:
    """AutoModelForCausalLM.from_pretrained(path, **kwargs) of a user's model directory (named `key`=path in
    errors); UserError when transformers cannot build it, when config.json does not describe the weights,
    or when a weight holds NaN or inf."""
    where = _where(path, key)
    config = kwargs.pop("config", None) or model_config(path, key)
    kwargs.update(config=config, output_loading_info=True, ignore_mismatched_sizes=True)
    try:
        with hf_progress_off(), _no_load_report():
            model, info = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except RuntimeError as e:  # a weight transformers could not convert or copy into the model
        if "CUDA" in str(e) or "out of memory" in str(e):
            raise
        raise UserError(f"{where}: transformers cannot load its weights into the model config.json describes: "
                        f"{_first_line(e)}") from None
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: m[0])
    if mismatched:
        name, in_files, in_model = mismatched[0]
        raise UserError(f"{where}: config.json does not match the weights: {len(mismatched)} weight(s) have another "
                        f"shape in the files (first: {name} is {_shape(in_files)} in the files, {_shape(in_model)} "
                        "in the model config.json describes)")
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise UserError(f"{where}: config.json does not match the weights: {len(missing)} weight(s) of the model it "
                        f"describes are not in the files (first: {missing[0]}); they would start random")
    unexpected = sorted(info.get("unexpected_keys") or ())
    if unexpected:
        raise UserError(f"{where}: config.json does not match the weights: {len(unexpected)} weight(s) in the files "
                        f"have no place in the model it describes (first: {unexpected[0]}); they would be dropped")
    check_finite(model, where)
    return model


def check_finite(model: Any, where: str) -> None:
    """UserError naming `where` and the first weight holding NaN or inf (a diverged run's checkpoint): such a
    model generates garbage until its length limit, so it is refused before it generates. One reduction per
    tensor (its sum, in float32: NaN and inf survive it); the element count only for a tensor that fails."""
    for name, t in model.named_parameters():  # not buffers: a mask buffer may hold -inf on purpose
        if not t.is_floating_point() or t.numel() == 0 or t.device.type == "meta":
            continue
        if bool(torch.isfinite(t.detach().sum(dtype=torch.float32))):
            continue
        bad = int((~torch.isfinite(t.detach())).sum())
        if bad:
            raise UserError(f"{where}: weight {name} holds {bad} NaN or infinite value(s) of {t.numel()} (a diverged "
                            "or damaged checkpoint); refusing to generate from it")
        raise UserError(f"{where}: weight {name} holds values so large that their sum overflows (a diverged "
                        "checkpoint); refusing to generate from it")


def cache_kwarg(model: Any) -> str:
    """The keyword of `model.forward` that takes the KV cache: `cache` (transformers' current name, e.g.
    Qwen2ForCausalLM in transformers 5.24), or `past_key_values` for a model whose forward names only
    that (older transformers, remote code). transformers 5.x still accepts `past_key_values` where it
    renamed it, with a FutureWarning on every run and removal announced for 5.40, so the new name is
    used wherever the signature has it; the two reach the same code (the argument is only renamed)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a readable signature: the current name
        return "cache"
    if "cache" not in params and "past_key_values" in params:
        return "past_key_values"
    return "cache"
