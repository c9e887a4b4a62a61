"""Tiny Qwen2 models trained from scratch on a task's own text (the recipe methods' model init).

- `fresh_qwen2`: save a tokenizer and a seeded, randomly initialised Qwen2 of a given shape; load both back.
- `init_model`: the one init every method shares: BPE on the text a method names (its task's text and its
  own strings), optionally a second pass that adds the whole contexts its scripted agents reach with the
  first tokenizer, then `fresh_qwen2`. Each method (memrl.recipes.<method>.init) supplies the text, the
  scripted plays and the shape.
- `check_pieces`: warn when a synthetic piece is not one token per word (chunks would not line up with facts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from memrl.models.tiny import CHAT_TEMPLATE_COMPACT_TOOLS, ModelPreset, qwen2_config, train_tokenizer
from memrl.quiet import encode_document, hf_progress_off
from memrl.types import Task

log = logging.getLogger(__name__)


def fresh_qwen2(init_dir: str | Path, tokenizer: Any, shape: ModelPreset, seed: int) -> tuple[Any, Any]:
    """(tokenizer, model) loaded back from `init_dir`, where `tokenizer` and a Qwen2 of `shape` (vocabulary:
    the tokenizer's length), initialised under torch.manual_seed(seed), are saved."""
    tokenizer.save_pretrained(init_dir)
    torch.manual_seed(seed)
    with hf_progress_off():
        cfg = qwen2_config(shape, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
        Qwen2ForCausalLM(cfg).save_pretrained(init_dir)
        return AutoTokenizer.from_pretrained(init_dir), AutoModelForCausalLM.from_pretrained(init_dir)


def init_model(out: str | Path, shape: ModelPreset, vocab_size: int, seed: int,
               text: Callable[[tuple[str, ...]], str], extra: list[str] = (), play: Callable[[Any], list[Any]] | None = None,
               chat: bool = True, fit_length: bool = True) -> tuple[Any, Any]:
    """(tokenizer, model): BPE (`vocab_size`, `seed`) on `text(extra x 10)` (written to out/tokenizer_corpus.txt);
    with `play`, a second pass: the first tokenizer plays the scripted agents (`play(tokenizer)` -> their groups)
    and the whole contexts they reach (every row's prompt and response) join the text, `text(extra x 10 + seen
    x 10)`. `chat`: compact-tools ChatML; `fit_length`: model_max_length the shape's positions (else
    train_tokenizer's); a Qwen2 of `shape` saved to out/init (fresh_qwen2)."""
    out = Path(out)
    corpus = out / "tokenizer_corpus.txt"

    def tokenizer(extra: list[str]) -> Any:
        corpus.write_text(text(tuple(extra)), encoding="utf-8")
        tok = train_tokenizer([corpus], vocab_size, seed)
        if chat:
            tok.chat_template = CHAT_TEMPLATE_COMPACT_TOOLS
        return tok

    tok = tokenizer(list(extra) * 10)
    if play is not None:
        seen = [tok.decode(s.prompt_ids + s.response_ids) for g in play(tok) for s in g.trajectories[0].segments]
        tok = tokenizer(list(extra) * 10 + seen * 10)
    if fit_length:
        tok.model_max_length = shape.max_position_embeddings
    return fresh_qwen2(out / "init", tok, shape, seed)


def check_pieces(tokenizer: Any, sample: Task, chunk_words: int) -> None:
    """Warn unless the synthetic task `sample`'s pieces are one token per word (chunks line up with facts)."""
    n_tok, want = len(encode_document(tokenizer, sample.context)), sample.meta["num_chunks"] * chunk_words
    if n_tok != want:
        log.warning("synthetic pieces are %d tokens, expected %d: chunks will not align with facts", n_tok, want)
