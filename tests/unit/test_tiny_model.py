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


@pytest.mark.parametrize("preset, model_type, cls", [
    ("tiny-qwen3", "qwen3", "Qwen3ForCausalLM"),
    ("tiny-qwen3-moe", "qwen3_moe", "Qwen3MoeForCausalLM"),
])
def test_cli_model_init_qwen3_presets(tmp_path, capsys, preset, model_type, cls):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.cli import main

    out = tmp_path / preset
    assert main(["model", "init", "--preset", preset, "--out", str(out), "--vocab-size", "512"]) == 0
    assert f"wrote {preset} model" in capsys.readouterr().out
    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert (model.config.model_type, type(model).__name__) == (model_type, cls)
    # 512 BPE entries + 4 plain added tokens (<think>, </think>, <tool_call>, </tool_call>)
    assert model.config.vocab_size == len(tok) == 516
    assert [tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")] == [
        512, 513, 514, 515]
    # not special: decoding without special tokens keeps them (a thinking reply's tags survive)
    ids = tok.encode("<think>a</think>b<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<think>a</think>b"
    if model_type == "qwen3_moe":
        assert (model.config.num_experts, model.config.num_experts_per_tok) == (8, 2)


QWEN3_CHAT = [
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "<think>\nr1\n</think>\n\nA1"},
    {"role": "user", "content": "Q2"},
]


def test_qwen3_template_thinking_switch_and_history():
    """QWEN3_CHAT_TEMPLATE renders as Qwen3's template does (hand-checked against its rules): an earlier
    turn's think block is dropped from history; enable_thinking=false puts an empty think block in the
    generation prompt; the turns after the last user message keep theirs; tool results merge into one
    user turn."""
    tok = train_tokenizer(None, 300, arch="qwen3")
    history = "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
    render = tok.apply_chat_template
    assert render(QWEN3_CHAT, tokenize=False, add_generation_prompt=True) == history + "<|im_start|>assistant\n"
    assert render(QWEN3_CHAT, tokenize=False, add_generation_prompt=True, enable_thinking=True) == (
        history + "<|im_start|>assistant\n")
    assert render(QWEN3_CHAT, tokenize=False, add_generation_prompt=True, enable_thinking=False) == (
        history + "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tail = [{"role": "assistant", "content": "<think>r2</think>A2"}, {"role": "tool", "content": "x"},
            {"role": "tool", "content": "y"}, {"role": "assistant", "content": "A3"}]
    assert render(QWEN3_CHAT + tail, tokenize=False) == history + (
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"  # after the last user turn: kept
        "<|im_start|>user\n<tool_response>\nx\n</tool_response>\n<tool_response>\ny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nA3<|im_end|>\n")  # the last turn: an empty block
    # reasoning_content wins over the content's own tags
    msg = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "R"}]
    assert render(msg, tokenize=False).endswith("<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n")


def test_random_model_of_a_published_shape(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

    from memrl.models.tiny import SHAPES, ModelPreset, model_config, random_model

    # Qwen3-0.6B's published parameter count: 151936*1024 (tied) + 28 layers * 15.1M = 596,049,920
    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen3ForCausalLM(model_config(SHAPES["qwen3-0.6b"], 151936, 1, 0)).parameters())
    assert n == 596_049_920
    small = ModelPreset(5000, 64, 128, 2, 4, 2, arch="qwen3")  # a small shape keeps the test fast
    out = random_model(tmp_path / "m", small, dtype=torch.bfloat16, cache_dir=tmp_path / "cache")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "qwen3" and model.config.vocab_size == 5000
    assert model.dtype == torch.bfloat16 and len(AutoTokenizer.from_pretrained(out)) == 4100
    with pytest.raises(ValueError, match="shape vocab_size 1000 is below the tokenizer's 4100"):
        random_model(tmp_path / "y", ModelPreset(1000, 64, 128, 2, 4, 2, arch="qwen3"), cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="unknown model shape 'qwen9'"):
        random_model(tmp_path / "x", "qwen9")
