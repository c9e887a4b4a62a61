"""GGUF files written by hand, byte for byte (the GGUF v3 layout), for the import tests: one tiny llama model
transformers can read (hidden 32, one block, a 262-token byte-level BPE vocabulary, ChatML), and hostile or
careless variants of it (no architecture, no hyperparameters, huge counts and lengths, non-finite Q4_1 scales,
a mislabelled architecture, a cut file).

Layout (little endian): b"GGUF", u32 version, u64 tensor count, u64 key/value count, the key/values (u64
length + key bytes, u32 value type, value), the tensor infos (name, u32 dimension count, u64 per dimension
innermost first, u32 ggml type, u64 data offset), padding to the alignment (32), then the tensor data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# GGUF value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
           BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
# ggml tensor types
F32, Q4_1 = 0, 3
ALIGN = 32

HIDDEN, FF, HEADS, KV_HEADS, CONTEXT = 32, 64, 2, 1, 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte value."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


TOKENS = _byte_alphabet() + ["Ġt", "he", "Ġthe"] + SPECIALS
MERGES = ["Ġ t", "h e", "Ġt he"]
VOCAB = len(TOKENS)  # 262


def string(s: str | bytes) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def value(vtype: int, v: Any) -> bytes:
    if vtype == STRING:
        return string(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    return struct.pack(_SCALAR[vtype], v)


def kv(key: str, vtype: int, v: Any) -> bytes:
    return string(key) + struct.pack("<I", vtype) + value(vtype, v)


@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]
    """innermost first (GGUF order): a [rows, cols] torch weight is (cols, rows)"""
    gtype: int
    data: bytes


@dataclass
class Model:
    """What a GGUF file holds; `to_bytes` writes it, the counts overridable to lie."""

    kvs: list[bytes] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    tensor_count: int | None = None
    kv_count: int | None = None

    def to_bytes(self) -> bytes:
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors) if self.tensor_count is None else self.tensor_count,
                                     len(self.kvs) if self.kv_count is None else self.kv_count)
        head += b"".join(self.kvs)
        data, offsets = b"", []
        for t in self.tensors:
            data += b"\0" * (-len(data) % ALIGN)
            offsets.append(len(data))
            data += t.data
        for t, off in zip(self.tensors, offsets, strict=True):
            head += string(t.name) + struct.pack("<I", len(t.dims)) + b"".join(struct.pack("<Q", d) for d in t.dims)
            head += struct.pack("<IQ", t.gtype, off)
        return head + b"\0" * (-len(head) % ALIGN) + data

    def write(self, path: Path) -> Path:
        path.write_bytes(self.to_bytes())
        return path


def f32(name: str, dims: tuple[int, ...], rng: np.random.Generator, scale: float = 0.05) -> Tensor:
    n = int(np.prod(dims))
    return Tensor(name, dims, F32, (rng.standard_normal(n) * scale).astype("<f4").tobytes())


def q4_1(name: str, dims: tuple[int, ...], rng: np.random.Generator, scale: float = 0.01) -> Tensor:
    """Q4_1 blocks of 32 weights: f16 scale d, f16 minimum m, 16 bytes of 4-bit q; weight = d * q + m."""
    n = int(np.prod(dims))
    assert n % 32 == 0 and dims[0] % 32 == 0
    blocks = []
    for _ in range(n // 32):
        blocks.append(struct.pack("<ee", scale, -8 * scale) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes())
    return Tensor(name, dims, Q4_1, b"".join(blocks))


def hyper(arch: str = "llama", blocks: int = 1, skip: tuple[str, ...] = ()) -> list[bytes]:
    fields = [("context_length", UINT32, CONTEXT), ("embedding_length", UINT32, HIDDEN),
              ("block_count", UINT32, blocks), ("feed_forward_length", UINT32, FF),
              ("attention.head_count", UINT32, HEADS), ("attention.head_count_kv", UINT32, KV_HEADS),
              ("rope.freq_base", FLOAT32, 10000.0), ("attention.layer_norm_rms_epsilon", FLOAT32, 1e-5)]
    return [kv(f"{arch}.{k}", t, v) for k, t, v in fields if k not in skip]


def tokenizer_kvs() -> list[bytes]:
    return [kv("tokenizer.ggml.model", STRING, "gpt2"), kv("tokenizer.ggml.pre", STRING, "default"),
            kv("tokenizer.ggml.tokens", ARRAY, (STRING, TOKENS)),
            kv("tokenizer.ggml.token_type", ARRAY, (INT32, [1] * (VOCAB - len(SPECIALS)) + [3] * len(SPECIALS))),
            kv("tokenizer.ggml.merges", ARRAY, (STRING, MERGES)),
            kv("tokenizer.ggml.bos_token_id", UINT32, TOKENS.index("<|im_start|>")),
            kv("tokenizer.ggml.eos_token_id", UINT32, TOKENS.index("<|im_end|>")),
            kv("tokenizer.ggml.padding_token_id", UINT32, TOKENS.index("<|endoftext|>")),
            kv("tokenizer.chat_template", STRING, CHATML)]


def llama_tensors(rng: np.random.Generator, blocks: int = 1, quant_ffn: bool = False) -> list[Tensor]:
    """A llama model's tensors under llama.cpp's names (tied output: no output.weight)."""
    head_dim = HIDDEN // HEADS
    ts = [f32("token_embd.weight", (HIDDEN, VOCAB), rng), Tensor("output_norm.weight", (HIDDEN,), F32,
                                                                  np.ones(HIDDEN, "<f4").tobytes())]
    mat = q4_1 if quant_ffn else f32
    for i in range(blocks):
        b = f"blk.{i}."
        ts += [Tensor(b + "attn_norm.weight", (HIDDEN,), F32, np.ones(HIDDEN, "<f4").tobytes()),
               f32(b + "attn_q.weight", (HIDDEN, HIDDEN), rng),
               f32(b + "attn_k.weight", (HIDDEN, KV_HEADS * head_dim), rng),
               f32(b + "attn_v.weight", (HIDDEN, KV_HEADS * head_dim), rng),
               f32(b + "attn_output.weight", (HIDDEN, HIDDEN), rng),
               Tensor(b + "ffn_norm.weight", (HIDDEN,), F32, np.ones(HIDDEN, "<f4").tobytes()),
               mat(b + "ffn_gate.weight", (HIDDEN, FF), rng), mat(b + "ffn_up.weight", (HIDDEN, FF), rng),
               mat(b + "ffn_down.weight", (FF, HIDDEN), rng)]
    return ts


def tiny_llama(arch: str = "llama", seed: int = 0, quant_ffn: bool = True) -> Model:
    """A whole, importable model: 1 block, hidden 32, vocabulary 262, Q4_1 feed-forward weights."""
    rng = np.random.default_rng(seed)
    return Model(kvs=[kv("general.architecture", STRING, arch), kv("general.name", STRING, "tiny test llama"),
                      *hyper(arch), *tokenizer_kvs()], tensors=llama_tensors(rng, quant_ffn=quant_ffn))


def llama_parameters() -> int:
    """The tiny llama's parameter count (tied embedding), by hand."""
    kv_dim = KV_HEADS * (HIDDEN // HEADS)
    block = 2 * HIDDEN + 2 * HIDDEN * HIDDEN + 2 * HIDDEN * kv_dim + 3 * HIDDEN * FF
    return VOCAB * HIDDEN + HIDDEN + block


def inf_scales(model: Model, name: str = "blk.0.ffn_up.weight") -> Model:
    """The Q4_1 tensor `name` with its first block's scale set to +inf (f16 0x7c00)."""
    for t in model.tensors:
        if t.name == name:
            assert t.gtype == Q4_1
            t.data = struct.pack("<H", 0x7C00) + t.data[2:]
            return model
    raise KeyError(name)
