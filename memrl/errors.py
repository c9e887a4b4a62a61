"""User-facing errors and the up-front checks that raise them.

`UserError` is what the `memrl` command prints as one line (no traceback unless --debug): bad files,
overrides, presets, paths, model directories, unknown names. Anything else escaping a command is a bug
and keeps its traceback. `fault_point` lets the fault-injection tests kill the process at a named place.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from pathlib import Path

from memrl.model_files import ModelFilesError, check_model_files

WEIGHT_FILES = re.compile(r".*\.safetensors$|.*\.safetensors\.index\.json$|pytorch_model.*\.bin$|.*\.bin\.index\.json$")
"""Files a HuggingFace directory keeps its weights in."""


class UserError(ValueError):
    """Bad input from the user; the message names the thing and what was expected."""

    exit_code = 1


class UsageError(UserError):
    """A bad command line (override, preset, option value): exit status 2, like argparse."""

    exit_code = 2


def os_message(e: OSError) -> str:
    """'<strerror>: <file>' for an OSError, without the '[Errno N]' prefix."""
    what = e.strerror or str(e)
    return f"{what}: {e.filename}" if e.filename else what


_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "StorageFull",
                   "unexpected pos")  # torch.save's zip writer after a short write (a full disk)


def disk_full(e: BaseException) -> bool:
    """Whether `e`, or an error it was raised from, is a full disk or an exhausted quota: an OSError
    (ENOSPC / EDQUOT), or a library's wrapping of one (safetensors' SafetensorError, torch.save's
    "unexpected pos", DCP's CheckpointException and a remote worker's error quoting them)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(s in str(e) for s in _DISK_FULL_TEXT):
            return True
        e = e.__cause__ or e.__context__
    return False


def _dir_problem(out: Path) -> str | None:
    """Create directory `out`; what stops it (or a file being written in it), None when all is well."""
    if out.exists() and not out.is_dir():
        return "exists and is not a directory"
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"cannot be created: {blocker} is a file, not a directory"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write_test"
        probe.write_text("ok", encoding="utf-8")
        probe.unlink()
    except OSError as e:
        return f"is not writable ({e.strerror or e})"
    return None


def writable_dir(path: str | os.PathLike[str], key: str = "--out") -> Path:
    """Create `path` and prove a file can be written in it; UserError naming the option `key` otherwise."""
    if not str(path).strip():  # Path("") is ".": an empty value would write into the current directory
        raise UsageError(f"{key} is empty; give an output directory")
    out = Path(path)
    problem = _dir_problem(out)
    if problem:
        raise UserError(f"output directory {key}={out} {problem}")
    return out


def writable_file(path: str | os.PathLike[str], key: str) -> Path:
    """Check an output file can be written (its directory created), before any work; UserError otherwise."""
    if not str(path).strip():
        raise UsageError(f"{key} is empty; give an output file")
    p = Path(path)
    if p.is_dir():
        raise UserError(f"output file {key}={p} is a directory")
    problem = _dir_problem(p.parent)
    if problem:
        raise UserError(f"output file {key}={p}: its directory {p.parent} {problem}")
    return p


def model_dir(path: str, key: str) -> Path:
    """A HuggingFace model directory named by config key `key`, else UserError: it holds config.json,
    and its config, weights and tokenizer pass `memrl.model_files.check_model_files`."""
    p = Path(path)
    if not path:
        raise UsageError(f"{key} is required (a HuggingFace model directory)")
    if not p.exists():
        raise UserError(f"{key}={path}: no such directory (expected a HuggingFace model directory)")
    if not p.is_dir():
        raise UserError(f"{key}={path} is a file, not a HuggingFace model directory")
    if not (p / "config.json").is_file():
        raise UserError(f"{key}={path} has no config.json (expected a HuggingFace model directory){_run_hint(p)}")
    hint = weightless_hint(p)
    if hint:
        raise UserError(f"{key}={path}: {hint}")
    try:
        check_model_files(p, key)
    except ModelFilesError as e:
        raise UserError(str(e)) from None
    return p


def weightless_hint(path: Path) -> str | None:
    """For a directory with config.json but no weights (a verl checkpoint's huggingface/ folder): what is
    wrong and the conversion command; None when it has weights."""
    if not (path / "config.json").is_file() or any(WEIGHT_FILES.fullmatch(q.name) for q in path.iterdir()):
        return None
    actor = path.parent
    if path.name == "huggingface" and any(actor.glob("model_world_size_*_rank_*.pt")):
        dest = actor.parent / "hf" if actor.name == "actor" else actor / "hf"
        return (f"{path} holds a config and tokenizer but no weights: it is the huggingface/ folder of a verl "
                f"checkpoint; convert it first: memrl model convert --from verl {actor} --out {dest}")
    return (f"{path} has config.json but no weights (*.safetensors or pytorch_model*.bin); a verl or Megatron "
            "checkpoint converts with: memrl model convert --from verl|megatron SRC --out DIR")


def _run_hint(p: Path) -> str:
    """For a training run's directory (or its checkpoints/) given as a model: the checkpoint to give instead."""
    for root in (p / "checkpoints", p):
        try:
            name = (root / "latest").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if name.startswith("step_") and (root / name / "config.json").is_file():
            return f"; it is a training run: its latest checkpoint is {root / name}"
    return ""


def fault_point(name: str) -> None:
    """Test hook: MEMRL_FAULT_AT=name (or name@k, the k-th time) SIGKILLs this process here."""
    want = os.environ.get("MEMRL_FAULT_AT")
    if not want:
        return
    target, _, nth = want.partition("@")
    if target != name:
        return
    count = _FAULT_COUNTS.get(name, 0) + 1
    _FAULT_COUNTS[name] = count
    if count >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


_FAULT_COUNTS: dict[str, int] = {}
