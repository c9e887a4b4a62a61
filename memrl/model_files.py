"""Up-front checks of a HuggingFace model directory's files, before anything loads it.

transformers reports a broken directory late and obliquely (a traceback from deep inside the loader, or,
for a missing tokenizer.json, an empty tokenizer that silently encodes every prompt to nothing). These
checks read only small files and the safetensors headers, and name the directory and what is missing:

- config.json: a JSON object with a `model_type` (what AutoModel dispatches on);
- weights: model.safetensors, a sharded index with every shard present, or pytorch_model.bin[.index.json];
  each safetensors file's header is read and must cover the whole file (a cut download fails here);
- tokenizer: a vocabulary (tokenizer.json, tokenizer.model, vocab.json + merges.txt, or vocab.txt) and a
  chat template (chat_template.jinja / .json or tokenizer_config.json's `chat_template`): every memrl
  workflow formats its prompts with it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path


class ModelFilesError(ValueError):
    """A model directory's files are missing or damaged; the message names the directory and what. The
    callers (`memrl.errors.model_dir`, `memrl data stats`) report it as a `memrl.errors.UserError` (this
    module stays below memrl.errors: no import cycle)."""

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
VOCAB_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def weights_digest(path: str | Path) -> str:
    """SHA-256 over a model directory's weight files (*.safetensors, *.bin; each file's name, then its bytes,
    in name order): what a LoRA run's checkpoints record of the base weights they adapt, so `--resume` onto
    other weights at the same path is caught by content, not by the path's spelling."""
    h = hashlib.sha256()
    p = Path(path)
    for f in sorted([*p.glob("*.safetensors"), *p.glob("*.bin")]):
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def check_model_files(path: str | Path, key: str) -> None:
    """Config, weights and tokenizer of the model directory `path` (named by option `key`); ModelFilesError
    naming the directory and what is missing or damaged. The directory itself is checked by
    `memrl.errors.model_dir`, which calls this."""
    p = Path(path)
    where = f"{key}={path}"
    _check_config(p, where)
    _check_weights(p, where)
    check_tokenizer_files(p, where)


def _check_config(p: Path, where: str) -> None:
    try:
        cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ModelFilesError(f"{where}: config.json is not UTF-8 text") from e
    except json.JSONDecodeError as e:
        raise ModelFilesError(f"{where}: config.json is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from e
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str) or not cfg["model_type"]:
        raise ModelFilesError(f"{where}: config.json has no \"model_type\" (expected a HuggingFace model config)")


def _check_weights(p: Path, where: str) -> None:
    present = [f for f in WEIGHT_FILES if (p / f).is_file()]
    if not present:
        raise ModelFilesError(f"{where} has no model weights (expected {', '.join(WEIGHT_FILES[:-1])} "
                        f"or {WEIGHT_FILES[-1]})")
    for index in (f for f in present if f.endswith(".index.json")):
        for shard in _index_shards(p / index, where):
            if not (p / shard).is_file():
                raise ModelFilesError(f"{where}: weight shard {shard} (listed in {index}) is missing")
            if shard.endswith(".safetensors"):
                _check_safetensors(p / shard, where)
    if "model.safetensors" in present:
        _check_safetensors(p / "model.safetensors", where)


def _index_shards(index: Path, where: str) -> list[str]:
    try:
        shards = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        names = sorted({str(s) for s in shards})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelFilesError(f"{where}: {index.name} is not a valid weight index (expected JSON with a "
                        "\"weight_map\" object)") from e
    if not names or any("/" in s or "\\" in s or s.startswith(".") for s in names):
        raise ModelFilesError(f"{where}: {index.name} lists no weight shards, or names outside the directory")
    return names


def safetensors_problem(f: Path) -> str | None:
    """What is wrong with safetensors file `f` (header unreadable, data cut short), None when it is whole.

    The format: 8 bytes little-endian header length N, N bytes of JSON {name: {dtype, shape,
    data_offsets: [begin, end]}, "__metadata__": {...}}, then the tensor data; the largest `end` is the
    data's length, so the file must be exactly 8 + N + that long.
    """
    size = f.stat().st_size
    with f.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            return f"its header claims {n} bytes but the file has {size} (cut short or not safetensors)"
        raw = fh.read(n)
    try:
        header = json.loads(raw)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "its header is not valid safetensors JSON"
    want = 8 + n + max(ends, default=0)
    if size < want:
        return f"it holds {size} bytes but its header describes {want} (cut short)"
    return None


def _check_safetensors(f: Path, where: str) -> None:
    problem = safetensors_problem(f)
    if problem:
        raise ModelFilesError(f"{where}: {f.name} is damaged: {problem}")


def check_tokenizer_files(p: Path, where: str, chat_template: bool = True) -> None:
    """A tokenizer vocabulary (and, with `chat_template`, a chat template) in directory `p`; ModelFilesError
    naming `where` otherwise."""
    if not any(all((p / f).is_file() for f in files) for files in VOCAB_FILES):
        raise ModelFilesError(f"{where} has no tokenizer (expected tokenizer.json, tokenizer.model, "
                        "vocab.json + merges.txt, or vocab.txt)")
    if not chat_template or (p / "chat_template.jinja").is_file() or (p / "chat_template.json").is_file():
        return
    try:
        tok_cfg = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tok_cfg = None
    if not (isinstance(tok_cfg, dict) and tok_cfg.get("chat_template")):
        raise ModelFilesError(f"{where} has no chat template (expected chat_template.jinja, chat_template.json or "
                        "\"chat_template\" in tokenizer_config.json; memrl's workflows format every prompt with it)")
