"""A GGUF file's header read with every declared size bounded, before anything trusts it (`memrl model import`).

The `gguf` package's reader (what transformers uses) believes what a header declares: a count of 2^40 array
items is walked item by item (minutes, then MemoryError), and a file that names an architecture but no
hyperparameters becomes transformers' default config of that architecture (Llama: 6.7B parameters). This
reader walks the same layout (GGUF v2 / v3, little endian) in pure Python over a memory map and refuses,
in one line naming the file, before anything is allocated:

- a count, string or array length larger than the bytes left in the file could hold (or than MAX_* below);
- a tensor with more than 4 dimensions, an unknown ggml type, data past the end of the file, or a row
  length that is not a whole number of quantization blocks;
- duplicate keys or tensor names.

`check_model(header, path)` then asks what a model needs: an architecture, the hyperparameters its config
is built from (REQUIRED, where transformers reads that key for the architecture), a vocabulary, and
tensors for exactly the blocks `block_count` declares.

Layout (GGUF v3): magic "GGUF", u32 version, u64 tensor count, u64 key/value count; key/values (u64 length +
UTF-8 key, u32 value type, value: scalars, u64 length + bytes for strings, u32 item type + u64 count +
items for arrays); tensor infos (name, u32 dimension count, u64 per dimension innermost first, u32 ggml
type, u64 offset from the data start); padding to `general.alignment` (32); the tensor data.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.models.errors import ConvertError

MAX_KV = 1 << 16
"""Key/value pairs (real files hold a few dozen)."""
MAX_TENSORS = 1 << 20
MAX_ARRAY_STRINGS = 1 << 22
"""Strings in one array (the largest vocabularies and merge lists are a few hundred thousand)."""
MAX_DEPTH = 3
"""Arrays of arrays, nested at most this deep."""
MAX_DIMS = 4
"""GGML_MAX_DIMS."""
REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "context_length")
"""Hyperparameters a GGUF model file must state, for each architecture whose key transformers reads
(GGUF_CONFIG_MAPPING); without them transformers falls back to its own defaults: a different model."""

STRING, ARRAY = 8, 9
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_INTEGER = {0, 1, 2, 3, 4, 5, 10, 11}
_MIN_SIZE = {**{t: n for t, (_, n) in _SCALARS.items()}, STRING: 8, ARRAY: 12}
_BLOCK = re.compile(r"blk\.(\d+)\.")
_RENAMED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}


class HeaderError(ConvertError):
    """The header declares something the file cannot hold (one line, naming the file)."""


@dataclass(frozen=True)
class ArrayInfo:
    item_type: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]
    """innermost first, as stored"""
    ggml_type: int
    type_name: str
    elements: int
    nbytes: int


@dataclass
class Header:
    version: int
    size: int
    """the file's size in bytes"""
    fields: dict[str, Any] = field(default_factory=dict)
    """key -> value: int / float / bool / str for scalars and strings, ArrayInfo for arrays"""
    tensors: list[TensorInfo] = field(default_factory=list)

    @property
    def architecture(self) -> Any:
        return self.fields.get("general.architecture")

    @property
    def elements(self) -> int:
        return sum(t.elements for t in self.tensors)


class _Cursor:
    def __init__(self, buf: Any, size: int, where: str) -> None:
        self.buf, self.size, self.pos, self.where = buf, size, 0, where

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise HeaderError(f"{self.where}: damaged GGUF file ({what} needs {n:,} bytes at byte {self.pos:,}, "
                              f"but the file has {self.left():,} left: cut short or not a real header)")

    def unpack(self, fmt: str, n: int, what: str) -> Any:
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str, limit: int | None = None) -> bytes:
        n = self.unpack("<Q", 8, f"the length of {what}")
        if limit is not None and n > limit:
            raise HeaderError(f"{self.where}: damaged GGUF file ({what} declares {n:,} bytes, over {limit:,})")
        self.need(n, f"{what} ({n:,} bytes declared)")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw

    def skip(self, n: int) -> None:
        self.pos += n


def _text(raw: bytes, what: str, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderError(f"{where}: damaged GGUF file ({what} is not UTF-8)") from None


def _value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype in _SCALARS:
        fmt, n = _SCALARS[vtype]
        return cur.unpack(fmt, n, f"the value of {key}")
    if vtype == STRING:
        return cur.string(f"the string {key}").decode("utf-8", errors="replace")
    if vtype != ARRAY:
        raise HeaderError(f"{cur.where}: damaged GGUF file ({key} has value type {vtype}, not one of GGUF's 0-12)")
    if depth >= MAX_DEPTH:
        raise HeaderError(f"{cur.where}: damaged GGUF file ({key} nests arrays over {MAX_DEPTH} deep)")
    item = cur.unpack("<I", 4, f"the item type of {key}")
    count = cur.unpack("<Q", 8, f"the length of {key}")
    if item not in _MIN_SIZE:
        raise HeaderError(f"{cur.where}: damaged GGUF file ({key} is an array of type {item}, not one of GGUF's 0-12)")
    least = count * _MIN_SIZE[item]
    if least > cur.left():
        raise HeaderError(f"{cur.where}: damaged GGUF file ({key} declares {count:,} array items, at least "
                          f"{least:,} bytes, but the file has {cur.left():,} left)")
    if item in _SCALARS:
        cur.skip(least)
    else:
        if count > MAX_ARRAY_STRINGS:
            raise HeaderError(f"{cur.where}: damaged GGUF file ({key} declares {count:,} array items, over "
                              f"{MAX_ARRAY_STRINGS:,})")
        for _ in range(count):
            if item == STRING:
                cur.string(f"an item of {key}")
            else:
                _value(cur, ARRAY, key, depth + 1)
    return ArrayInfo(item, count)


def read_header(path: Path) -> Header:
    """The header of GGUF file `path`, every size checked against the file (HeaderError otherwise)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: PLC0415 - the gguf extra

    where = str(path)
    size = path.stat().st_size
    if size < 24:
        raise HeaderError(f"{where}: damaged GGUF file ({size} bytes, shorter than a GGUF header)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, size, where)
        cur.skip(4)  # the magic, checked by the caller
        version = cur.unpack("<I", 4, "the version")
        if version not in (2, 3):
            swapped = "; a big-endian file?" if version & 0xFFFF == 0 else ""
            raise HeaderError(f"{where}: GGUF version {version} is not one memrl reads (2 or 3{swapped})")
        n_tensors = cur.unpack("<Q", 8, "the tensor count")
        n_kv = cur.unpack("<Q", 8, "the key/value count")
        for n, what, most, least in ((n_kv, "key/value pairs", MAX_KV, 13), (n_tensors, "tensors", MAX_TENSORS, 24)):
            if n > most or n * least > cur.left():
                raise HeaderError(f"{where}: damaged GGUF file (it declares {n:,} {what}, but its {size:,} bytes "
                                  f"cannot hold more than {min(most, cur.left() // least):,})")
        head = Header(version=version, size=size)
        for _ in range(n_kv):
            key = _text(cur.string("a key", limit=65535), "a key", where)
            vtype = cur.unpack("<I", 4, f"the value type of {key}")
            if key in head.fields:
                raise HeaderError(f"{where}: damaged GGUF file (key {key} appears twice)")
            head.fields[key] = _value(cur, vtype, key)
        infos = []
        for _ in range(n_tensors):
            name = _text(cur.string("a tensor name", limit=4096), "a tensor name", where)
            n_dims = cur.unpack("<I", 4, f"the dimension count of tensor {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise HeaderError(f"{where}: damaged GGUF file (tensor {name} has {n_dims} dimensions, GGUF allows "
                                  f"1 to {MAX_DIMS})")
            dims = tuple(cur.unpack("<Q", 8, f"the shape of tensor {name}") for _ in range(n_dims))
            gtype = cur.unpack("<I", 4, f"the type of tensor {name}")
            offset = cur.unpack("<Q", 8, f"the data offset of tensor {name}")
            infos.append((name, dims, gtype, offset))
        align = head.fields.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise HeaderError(f"{where}: damaged GGUF file (general.alignment={align!r} is not a power of two)")
        data_start = cur.pos + (-cur.pos % align)
        seen: set[str] = set()
        for name, dims, gtype, offset in infos:
            if name in seen:
                raise HeaderError(f"{where}: damaged GGUF file (tensor {name} appears twice)")
            seen.add(name)
            try:
                qtype = GGMLQuantizationType(gtype)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise HeaderError(f"{where}: tensor {name} has ggml type {gtype}, not one the gguf package "
                                  "knows") from None
            elements = 1
            for d in dims:
                elements *= d
            if elements == 0 or dims[0] % block:
                raise HeaderError(f"{where}: damaged GGUF file (tensor {name} has shape {list(dims)}; its rows must "
                                  f"be whole {qtype.name} blocks of {block})")
            nbytes = elements // block * type_size
            end = data_start + offset + nbytes
            if end > size:
                raise HeaderError(f"{where}: damaged GGUF file (tensor {name}'s data ends at byte {end:,}, past the "
                                  f"file's {size:,} bytes: cut short?)")
            head.tensors.append(TensorInfo(name, dims, gtype, qtype.name, elements, nbytes))
    return head


def hf_architecture(header: Header) -> str:
    """The architecture name transformers' GGUF tables use (llama.cpp writes qwen2moe, transformers qwen2_moe)."""
    arch = str(header.architecture)
    name = str(header.fields.get("general.name", "")).lower()
    if arch == "llama" and "mistral" in name:
        return "mistral"
    return _RENAMED.get(arch, arch)


def check_model(header: Header, path: Path, supported: dict[str, dict[str, Any]]) -> None:
    """ConvertError naming `path` unless the header describes a whole model: a supported architecture (keys of
    `supported`, transformers' GGUF_CONFIG_MAPPING), the REQUIRED hyperparameters that architecture reads as
    positive integers, a vocabulary, tensors, and tensors for exactly blocks 0..block_count-1."""
    arch = header.architecture
    if not isinstance(arch, str) or not arch.strip():
        raise ConvertError(f"{path}: no general.architecture in its header (got {arch!r}); not a model file")
    hf_arch = hf_architecture(header)
    known = sorted(k for k in supported if k not in ("general", "tokenizer"))
    if hf_arch not in known:
        import transformers  # noqa: PLC0415 - only for its version in the message

        raise ConvertError(f"{path}: architecture {arch!r} is not one transformers {transformers.__version__} reads "
                           f"from GGUF (it reads {', '.join(known)})")
    reads = supported[hf_arch]
    need = [f"{arch}.{k}" for k in REQUIRED if k in reads]
    absent = [k for k in need if k not in header.fields]
    if absent:
        raise ConvertError(f"{path}: its header lacks the {arch} hyperparameter(s) {', '.join(absent)} (transformers "
                           "would fill in its own defaults: another model)")
    for k in need:
        v = header.fields[k]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConvertError(f"{path}: {k}={v!r} in its header; expected a positive integer")
    tokens = header.fields.get("tokenizer.ggml.tokens")
    if not (isinstance(tokens, ArrayInfo) and tokens.item_type == STRING and tokens.count > 0):
        raise ConvertError(f"{path}: no tokenizer.ggml.tokens (an array of strings) in its header: the file holds no "
                           "vocabulary")
    if not header.tensors:
        raise ConvertError(f"{path}: the file holds no tensors (its header declares 0)")
    blocks = header.fields.get(f"{arch}.block_count")
    if isinstance(blocks, int):
        held = sorted({int(m.group(1)) for t in header.tensors if (m := _BLOCK.match(t.name))})
        if held != list(range(blocks)):
            shown = f"blocks {held[0]}..{held[-1]} ({len(held)})" if held else "no blk.N tensors"
            raise ConvertError(f"{path}: {arch}.block_count={blocks} but the file holds tensors of {shown}")
