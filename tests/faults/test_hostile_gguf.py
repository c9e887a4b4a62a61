"""`memrl model import` of crafted and damaged GGUF files (issue 80, items 2, 3 and 9): every one is refused in
one line naming the file, the header ones before the gguf package's reader sees the file, the model ones before
transformers allocates a model, and none leaves anything at --out. The files are written byte by byte
(gguf_files.py): a tiny llama transformers reads, then variants of it."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
from conftest import one_line
from gguf_files import (
    ARRAY,
    STRING,
    UINT32,
    Model,
    inf_scales,
    kv,
    llama_parameters,
    string,
    tiny_llama,
    tokenizer_kvs,
)

from memrl.cli import main
from memrl.models import gguf_import as G

pytest.importorskip("gguf")


def _import(src: Path, tmp_path: Path, capsys) -> str:
    out = tmp_path / "out"
    t0 = time.perf_counter()
    code = main(["model", "import", str(src), "--out", str(out)])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 1, err
    assert took < 30, f"refusing {src.name} took {took:.0f} s"
    assert not out.exists() or not any(out.iterdir())
    return one_line(err)


@pytest.fixture
def no_reader(monkeypatch):
    """The gguf package's reader and transformers' loader must not be reached: a refusal from the header alone."""
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM

    def never(*a, **k):
        raise AssertionError("the file reached a reader that trusts its header")

    monkeypatch.setattr(gguf.GGUFReader, "__init__", never)
    monkeypatch.setattr(AutoConfig, "from_pretrained", never)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", never)


@pytest.fixture
def no_model(monkeypatch):
    """transformers may read the header but build no model except on the meta device (nothing allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_config.__func__

    def meta_only(cls, config, *a, **k):
        assert torch.get_default_device().type == "meta", "a model was built outside the meta device"
        return real(cls, config, *a, **k)

    def never(*a, **k):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", classmethod(meta_only))
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", never)


def _header(*kvs: bytes, tensors: int = 0, n_kv: int | None = None) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, len(kvs) if n_kv is None else n_kv) + b"".join(kvs)


# Byte arithmetic: the 24-byte preamble (magic, version, two counts), then general.architecture=llama takes
# 8 + 20 (key) + 4 (type) + 8 + 5 (value) = 45 bytes: a 69-byte file, 45 bytes after the preamble, room for at
# most 45 // 13 key/value pairs (the smallest is 13 bytes) and 45 // 24 tensor infos.
HEADER_CASES = {
    # a 2^40-item uint32 array in a 133-byte-class file: the gguf reader walks it item by item (91 s, MemoryError)
    "huge_array": (_header(kv("general.architecture", STRING, "llama"),
                           string("llama.big") + struct.pack("<IIQ", ARRAY, UINT32, 1 << 40)),
                   "llama.big declares 1,099,511,627,776 array items, at least 4,398,046,511,104 bytes, but the file "
                   "has 0 left"),
    "huge_string": (_header(kv("general.architecture", STRING, "llama"),
                            string("general.name") + struct.pack("<IQ", STRING, 1 << 40) + b"x" * 16),
                    "the string general.name (1,099,511,627,776 bytes declared) needs 1,099,511,627,776 bytes at byte "
                    "101, but the file has 16 left"),
    "huge_kv_count": (_header(kv("general.architecture", STRING, "llama"), n_kv=1 << 40),
                      "it declares 1,099,511,627,776 key/value pairs, but its 69 bytes cannot hold more than 3"),
    "huge_tensor_count": (_header(kv("general.architecture", STRING, "llama"), tensors=1 << 40),
                          "it declares 1,099,511,627,776 tensors, but its 69 bytes cannot hold more than 1"),
    "huge_key": (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 62) + b"\0" * 16,
                 "a key declares 4,611,686,018,427,387,904 bytes, over 65,535"),
    "bad_type": (_header(string("general.architecture") + struct.pack("<I", 77)),
                 "general.architecture has value type 77, not one of GGUF's 0-12"),
    "nested_arrays": (_header(string("x") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * 4),
                      "x nests arrays over 3 deep"),
    "version": (b"GGUF" + struct.pack("<IQQ", 7, 0, 0), "GGUF version 7 is not one memrl reads (2 or 3)"),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_a_header_that_declares_more_than_the_file_holds_is_refused_before_any_reader(case, tmp_path, capsys,
                                                                                      no_reader):
    data, said = HEADER_CASES[case]
    src = tmp_path / f"{case}.gguf"
    src.write_bytes(data)
    line = _import(src, tmp_path, capsys)
    assert line.startswith(f"memrl model: error: {src}")
    assert said in line, line


def _tensor_info(name: str, dims: tuple[int, ...], gtype: int = 0, offset: int = 0) -> bytes:
    return (string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", gtype, offset))


def test_tensor_infos_that_lie_are_refused_before_any_reader(tmp_path, capsys, no_reader):
    arch = kv("general.architecture", STRING, "llama")
    cases = {
        "dims": (_header(arch, tensors=1) + _tensor_info("t", (1,) * 9), "tensor t has 9 dimensions, GGUF allows 1 to 4"),
        "past_end": (_header(arch, tensors=1) + _tensor_info("t", (1 << 20, 1 << 20)) + b"\0" * 64,
                     "tensor t's data ends at byte 4,398,046,511,232, past the file's 174 bytes"),
        "ggml_type": (_header(arch, tensors=1) + _tensor_info("t", (32,), gtype=999) + b"\0" * 200,
                      "tensor t has ggml type 999, not one the gguf package knows"),
        "twice": (_header(arch, tensors=2) + _tensor_info("t", (1,)) + _tensor_info("t", (1,)) + b"\0" * 64,
                  "tensor t appears twice"),
        "q4_rows": (_header(arch, tensors=1) + _tensor_info("t", (33,), gtype=3) + b"\0" * 200,
                    "tensor t has shape [33]; its rows must be whole Q4_1 blocks of 32"),
    }
    for case, (data, said) in cases.items():
        src = tmp_path / f"{case}.gguf"
        src.write_bytes(data)
        line = _import(src, tmp_path, capsys)
        assert line.startswith(f"memrl model: error: {src}: ") and said in line, (case, line)


def test_a_truncated_file_is_refused_before_any_reader(tmp_path, capsys, no_reader):
    whole = tiny_llama().to_bytes()
    for cut, said in ((len(whole) - 100, "tensor blk.0.ffn_down.weight's data ends at byte"),
                      (900, "tokenizer.ggml.tokens declares 262 array items, at least 2,096 bytes, but the file has 325 left"),
                      (30, "it declares 19 key/value pairs, but its 30 bytes cannot hold more than 0")):
        src = tmp_path / f"cut{cut}.gguf"
        src.write_bytes(whole[:cut])
        line = _import(src, tmp_path, capsys)
        assert line.startswith(f"memrl model: error: {src}: damaged GGUF file (") and said in line, (cut, line)


def test_an_architecture_without_hyperparameters_is_refused_not_a_default_6_7b_model(tmp_path, capsys, no_reader):
    """The 102-byte case: general.architecture=llama and nothing else. transformers would build LlamaConfig's
    defaults (6.7B parameters, 27 GB in float32)."""
    src = tmp_path / "bare.gguf"
    src.write_bytes(_header(kv("general.architecture", STRING, "llama")))
    assert _import(src, tmp_path, capsys) == (
        f"memrl model: error: {src}: its header lacks the llama hyperparameter(s) llama.block_count, "
        "llama.embedding_length, llama.feed_forward_length, llama.attention.head_count, llama.context_length "
        "(transformers would fill in its own defaults: another model)")


def test_no_or_an_empty_architecture_is_refused(tmp_path, capsys, no_reader):
    for arch, shown in ((None, "None"), ("", "''")):
        m = tiny_llama()
        m.kvs = m.kvs[1:] if arch is None else [kv("general.architecture", STRING, arch), *m.kvs[1:]]
        src = m.write(tmp_path / f"arch{shown}.gguf")
        assert _import(src, tmp_path, capsys) == (
            f"memrl model: error: {src}: no general.architecture in its header (got {shown}); not a model file")


def test_missing_vocabulary_tensors_or_blocks_are_refused(tmp_path, capsys, no_reader):
    m = tiny_llama()
    m.kvs = [k for k in m.kvs if b"tokenizer.ggml.tokens" not in k]
    src = m.write(tmp_path / "novocab.gguf")
    assert _import(src, tmp_path, capsys).endswith("no tokenizer.ggml.tokens (an array of strings) in its header: "
                                                   "the file holds no vocabulary")
    m = tiny_llama()
    m.tensors = []
    src = m.write(tmp_path / "notensors.gguf")
    assert _import(src, tmp_path, capsys).endswith("the file holds no tensors (its header declares 0)")
    m = tiny_llama()
    m.kvs = [kv("llama.block_count", UINT32, 40) if b"llama.block_count" in k else k for k in m.kvs]
    src = m.write(tmp_path / "blocks.gguf")
    assert _import(src, tmp_path, capsys) == (
        f"memrl model: error: {src}: llama.block_count=40 but the file holds tensors of blocks 0..0 (1)")
    m = tiny_llama()
    m.kvs = [kv("llama.embedding_length", UINT32, 0) if b"llama.embedding_length" in k else k for k in m.kvs]
    src = m.write(tmp_path / "zero.gguf")
    assert _import(src, tmp_path, capsys) == (
        f"memrl model: error: {src}: llama.embedding_length=0 in its header; expected a positive integer")


def test_hyperparameters_larger_than_the_tensors_are_refused_on_the_meta_device(tmp_path, capsys, no_model):
    """The header's sizes imply far more weights than the file holds: counted on the meta device, refused before
    anything is allocated (here a 4096-wide model over the tiny model's 17,696 weights)."""
    m = tiny_llama()
    m.kvs = [kv("llama.embedding_length", UINT32, 4096) if b"llama.embedding_length" in k else k for k in m.kvs]
    src = m.write(tmp_path / "wide.gguf")
    line = _import(src, tmp_path, capsys)
    assert line.startswith(f"memrl model: error: {src}: its header describes a llama model of ")
    assert line.endswith(f"parameters, but its 11 tensors hold {llama_parameters():,} weights (a mislabelled or "
                         "incomplete file); refusing it")


def test_a_llama_file_labelled_qwen3_is_refused_not_imported_with_random_weights(tmp_path, capsys, no_model):
    src = tiny_llama(arch="qwen3").write(tmp_path / "mislabelled.gguf")
    line = _import(src, tmp_path, capsys)
    assert line.startswith(f"memrl model: error: {src}: its header describes a qwen3 model of ")
    assert line.endswith(f"but its 11 tensors hold {llama_parameters():,} weights (a mislabelled or incomplete "
                         "file); refusing it")


def test_a_weight_the_file_does_not_hold_is_refused_not_left_random(tmp_path, capsys):
    """The same number of weights, one tensor under a name transformers does not map: without the check the
    import writes a model whose q_proj is freshly initialized (transformers' MISSING)."""
    m = tiny_llama()
    m.tensors[3].name = "blk.0.attn_qq.weight"
    src = m.write(tmp_path / "renamed.gguf")
    assert _import(src, tmp_path, capsys) == (
        f"memrl model: error: {src}: 1 weight(s) of LlamaForCausalLM are not in the file (e.g. "
        "model.layers.0.self_attn.q_proj.weight); they would be random: a mislabelled architecture?")


def test_infinite_q4_1_scales_are_refused_naming_the_tensor(tmp_path, capsys):
    """One Q4_1 block of blk.0.ffn_up.weight with scale +inf: its 32 weights dequantize to inf (q > 0) or NaN
    (q = 0); without the check they are written and `ask` / `eval` refuse the model later."""
    src = inf_scales(tiny_llama()).write(tmp_path / "inf.gguf")
    assert _import(src, tmp_path, capsys) == (
        f"memrl model: error: {src}: weight model.layers.0.mlp.up_proj.weight holds 32 NaN or infinite value(s) of "
        "2,048 after dequantization (damaged scales?); refusing to import it")


def test_the_tiny_llama_imports_whole(tmp_path, capsys):
    """The generator's untouched file imports, with the parameter count counted by hand and a digest per file."""
    src = tiny_llama().write(tmp_path / "tiny.gguf")
    out = tmp_path / "out"
    assert main(["model", "import", str(src), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"imported tiny.gguf (llama, {llama_parameters():,} parameters, from F32 x8, Q4_1 x3) to {out} as float32")
    rec = G.json.loads((out / G.IMPORT_RECORD).read_text())
    assert sorted(rec["files"]) == sorted(p.name for p in out.iterdir() if p.name != G.IMPORT_RECORD)
    assert rec["files"]["model.safetensors"] == G.sha256_file(out / "model.safetensors")


def test_a_full_disk_in_the_safetensors_writer_is_one_line(tmp_path, capsys, monkeypatch):
    """safetensors reports a full disk as SafetensorError, not OSError: the one-line handler missed it."""
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    def full(self, *a, **k):
        raise SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    src = tiny_llama().write(tmp_path / "tiny.gguf")
    out = tmp_path / "out"
    assert _import(src, tmp_path, capsys) == (
        f"memrl model: error: writing {out}: no space left on device (an imported float32 model of this size needs "
        "about 4 bytes per parameter); nothing was left at --out")
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]


def test_tokenizer_kvs_alone_are_not_a_model(tmp_path, capsys, no_reader):
    src = tmp_path / "tok.gguf"
    src.write_bytes(Model(kvs=tokenizer_kvs()).to_bytes())
    assert _import(src, tmp_path, capsys) == (
        f"memrl model: error: {src}: no general.architecture in its header (got None); not a model file")
