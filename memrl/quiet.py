"""Library output that memrl knows to be noise, turned off only where memrl knows better.

- `hf_progress_off()`: transformers' "Loading weights" / "Writing model shards" bars (and huggingface_hub's
  bars) around memrl's own loads and saves of model directories: a bar per load of a 3 MB model is
  noise in every log. Only the bars: transformers' warnings and errors still print.
- `encode_document()`: a whole document's ids without transformers' "Token indices sequence length is
  longer than the specified maximum" warning: memrl encodes whole documents on purpose and cuts them
  into chunks (or centre-truncates them) before any of them reaches the model.
- `peft_rename_warning_off()`: transformers' FutureWarning that `is_gradient_checkpointing` is renamed,
  which peft triggers by reading the old name when it wraps or saves a model (not memrl's call to change).

The progress switch is process-wide in transformers (a module flag), so the context manager restores the
state it found (nesting works); another thread loading a model at the same moment also gets no bar.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

try:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as tf_logging
except ImportError:  # transformers or huggingface_hub without these switches: nothing to silence
    tf_logging = None
try:
    from transformers import PreTrainedTokenizerBase
except ImportError:  # pragma: no cover - transformers is a dependency
    PreTrainedTokenizerBase = ()


@contextlib.contextmanager
def hf_progress_off() -> Iterator[None]:
    """No transformers / huggingface_hub progress bars inside the block; the previous state after it."""
    if tf_logging is None:  # transformers or huggingface_hub without these switches: nothing to silence
        yield
        return
    tf_on = tf_logging.is_progress_bar_enabled()
    hub_on = not are_progress_bars_disabled()
    tf_logging.disable_progress_bar()  # transformers' own bars; also turns huggingface_hub's off
    disable_progress_bars()
    try:
        yield
    finally:
        if tf_on:
            tf_logging.enable_progress_bar()  # also turns huggingface_hub's bars back on
        if hub_on:
            enable_progress_bars()
        else:
            disable_progress_bars()


def encode_document(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a whole document (no special tokens), which may be longer than the tokenizer's
    model_max_length: the caller chunks or truncates it, so transformers' warning about it is not shown.

    A transformers tokenizer is asked with verbose=False (that call only: the warning stays on for every
    other encode); any other tokenizer (the test doubles' character tokenizer) is called plainly."""
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return list(tokenizer.encode(text, add_special_tokens=False, verbose=False))
    return list(tokenizer.encode(text, add_special_tokens=False))


@contextlib.contextmanager
def peft_rename_warning_off() -> Iterator[None]:
    """Inside the block, no FutureWarning that transformers' `is_gradient_checkpointing` is renamed (peft
    reads the old name); every other warning as usual."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        yield
