"""Library noise memrl turns off where it knows better (memrl.quiet), and the cache keyword of the hf engine."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from memrl.engines.base import SamplingParams
from memrl.model_open import cache_kwarg
from memrl.models.tiny import cached_tiny_model
from memrl.quiet import encode_document, hf_progress_off


@pytest.fixture(scope="module")
def model_dir():
    return cached_tiny_model("tiny")


def _states() -> tuple[bool, bool]:
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as tf_logging

    return tf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()


def test_progress_off_inside_and_the_previous_state_after():
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as tf_logging

    before = _states()
    try:
        tf_logging.enable_progress_bar()
        enable_progress_bars()
        with hf_progress_off():
            assert _states() == (False, False)
            with hf_progress_off():  # nested: still off, and the outer block's state survives
                assert _states() == (False, False)
            assert _states() == (False, False)
        assert _states() == (True, True)
        # a user who turned the hub's bars off keeps them off; transformers' come back
        disable_progress_bars()
        with hf_progress_off():
            assert _states() == (False, False)
        assert _states() == (True, False)
    finally:
        (tf_logging.enable_progress_bar if before[0] else tf_logging.disable_progress_bar)()
        (enable_progress_bars if before[1] else disable_progress_bars)()


def test_progress_off_restores_after_an_error():
    from transformers.utils import logging as tf_logging

    before = _states()
    with pytest.raises(RuntimeError, match="boom"), hf_progress_off():
        raise RuntimeError("boom")
    assert _states() == before
    assert tf_logging.is_progress_bar_enabled() == before[0]


def test_encode_document_same_ids_and_no_length_warning(model_dir, caplog):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.model_max_length = 8
    text = "the river city film album band team game party state school book"  # 12 words, 12+ tokens
    caplog.set_level("WARNING", logger="transformers")
    ids = encode_document(tok, text)
    assert ids == tok.encode(text, add_special_tokens=False, verbose=False)
    assert len(ids) > 8
    assert [r.getMessage() for r in caplog.records] == []
    # the warning itself stays on for any other encode of the same tokenizer
    tok.encode(text, add_special_tokens=False)
    assert [r.getMessage()[:66] for r in caplog.records] == [
        "Token indices sequence length is longer than the specified maximum"]


def test_encode_document_plain_tokenizer():
    from doubles import CharTokenizer

    tok = CharTokenizer()
    assert encode_document(tok, "abc") == tok.encode("abc", add_special_tokens=False)


def test_cache_keyword_follows_the_forward_signature(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    assert cache_kwarg(AutoModelForCausalLM.from_pretrained(model_dir)) == "cache"  # transformers 5.24 Qwen2

    class OldStyle(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return None

    class Wrapped(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return None

    assert cache_kwarg(OldStyle()) == "past_key_values"
    assert cache_kwarg(Wrapped()) == "cache"


def test_hf_engine_decodes_without_future_warning(model_dir):
    from memrl.engines.hf import HFEngine

    async def go(engine):
        ids = engine.tokenizer.encode("Hello there.", add_special_tokens=False)
        return await engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=4))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = HFEngine(model_dir, max_batch_size=2, seed=0, deterministic=False)
        try:
            out = asyncio.run(go(engine))
        finally:
            asyncio.run(engine.close())
    assert len(out.token_ids) >= 1
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning | DeprecationWarning)] == []
