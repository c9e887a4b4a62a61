"""Tiny local models: tokenizer + random Qwen2 reload through the Auto classes; presets; ChatML template."""

from __future__ import annotations

import json

import pytest

from memrl.models.tiny import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    PRESETS,
    cached_tiny_model,
    init_tiny_model,
    qwen2_config,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return cached_tiny_model("tiny", tmp_path_factory.getbasetemp() / "memrl-models")


def test_reload_with_auto_classes(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.tie_word_embeddings
    assert model.config.max_position_embeddings >= 8192
    assert model.config.vocab_size == len(tok)
    assert (tiny_dir / "model.safetensors").is_file()
    assert tok.eos_token == IM_END and tok.pad_token == ENDOFTEXT
    for special in (ENDOFTEXT, IM_START, IM_END):
        ids = tok.encode(special, add_special_tokens=False)
        assert len(ids) == 1, f"{special} must be one token, got {ids}"
    n = sum(p.numel() for p in model.parameters())
    assert 2_500_000 <= n <= 3_500_000, n
    info = json.loads((tiny_dir / "memrl_model.json").read_text())
    assert info["num_parameters"] == n


def test_tokenizer_round_trips_and_is_compact(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    text = "Document 3:\nKalomi Tenvor\nFounded in 1875 (by the river), it was \"known\"; caf\u00e9 \u2013 \u00fcber!"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2  # BPE merges were learned
    assert tok.encode("hello", add_special_tokens=True) == tok.encode("hello", add_special_tokens=False)  # no BOS
    for tag in ("<problem>", "</memory>", "<section>", "<update>", "<recall>", "<recalled_memory>"):
        assert len(tok.encode(tag, add_special_tokens=False)) <= 5, tag


def test_chat_template_renders_chatml_exactly(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "\\boxed{4}"},
        {"role": "user", "content": "And 3+3?"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n\\boxed{4}<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    )
    assert tok.apply_chat_template(messages, tokenize=False) == expected
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        expected + "<|im_start|>assistant\n"
    )
    ids = tok.encode(expected + "<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids(IM_START)
    assert ids.count(tok.eos_token_id) == 4


def test_seeded_init_is_reproducible_and_corpus_is_used(tmp_path):
    import torch
    from safetensors.torch import load_file

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("zyxwv qqqq zyxwv qqqq " * 200, encoding="utf-8")
    a = init_tiny_model(tmp_path / "a", corpus=[corpus], seed=5, vocab_size=300)
    b = init_tiny_model(tmp_path / "b", corpus=[corpus], seed=5, vocab_size=300)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a)
    assert len(tok.encode(" zyxwv", add_special_tokens=False)) == 1  # learned from the given corpus


def test_cached_model_is_built_once(tiny_dir):
    stamp = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    again = cached_tiny_model("tiny", tiny_dir.parent)
    assert again == tiny_dir and (again / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        cached_tiny_model("huge", tiny_dir.parent)


def test_small_preset_size():
    import torch
    from transformers import Qwen2ForCausalLM

    tok = train_tokenizer(None, PRESETS["small"].vocab_size)
    assert len(tok) == PRESETS["small"].vocab_size  # the synthetic corpus is rich enough for every merge
    with torch.device("meta"):  # count parameters without allocating them
        model = Qwen2ForCausalLM(qwen2_config("small", len(tok), tok.eos_token_id, tok.pad_token_id))
    n = sum(p.numel() for p in model.parameters())
    assert 20_000_000 <= n <= 28_000_000, n


def test_cli_model_init(tmp_path, capsys):
    from memrl.cli import main

    out = tmp_path / "m"
    assert main(["model", "init", "--preset", "tiny", "--out", str(out), "--vocab-size", "1024"]) == 0
    assert "parameters" in capsys.readouterr().out
    assert json.loads((out / "memrl_model.json").read_text())["vocab_size"] == 1024
    assert main(["model", "init", "--out", str(out)]) == 1  # not empty, no --force
    assert "not empty" in capsys.readouterr().err
