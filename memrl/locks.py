"""One memrl process per output directory: `memrl train`, `train-sft`, `eval` and `demo` hold `<out>/.memrl.lock`.

The lock is an advisory `flock` on a file that holds the owner's pid: the kernel drops it when the owner
dies (kill -9 included), so a lock file left behind by a dead process is stale at once and taken over;
a live owner is named in the one-line refusal. The file itself stays (unlinking it would race a second
process that opened it already). `wait_lock` is the waiting kind, for work a second process should do after
the first rather than refuse (two `memrl model fetch` runs filling one cache).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memrl.errors import UserError, writable_dir

LOCK_FILE = ".memrl.lock"
log = logging.getLogger(__name__)


def _owner(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode("ascii", "replace").strip()
    return f"pid {text}" if text.isdigit() else "another process"


def acquire(path: str | os.PathLike[str], key: str) -> int:
    """Create `path` (writable_dir) and lock it; the lock's file descriptor (release it with `release`).
    UserError naming the directory and the live owner's pid when another process holds it."""
    out = writable_dir(path, key)
    lock = out / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserError(f"output directory {key}={out}: cannot create its lock file {lock} ({e.strerror})") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _owner(fd)
        os.close(fd)
        raise UserError(f"output directory {key}={out} is in use by {owner} (lock file {lock}); wait for it "
                        "to end or choose another directory") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def release(fd: int) -> None:
    os.close(fd)  # closing drops the flock


@contextmanager
def locked_dir(path: str | os.PathLike[str], key: str) -> Iterator[Path]:
    """`with locked_dir(out, "--out") as out:` the directory, created and held for the block."""
    fd = acquire(path, key)
    try:
        yield Path(path)
    finally:
        release(fd)


@contextmanager
def wait_lock(lock: Path, what: str) -> Iterator[None]:
    """Hold an exclusive flock on the file `lock` for the block, waiting (with one log line naming `what` and the
    owner's pid) while another process holds it. A lock whose owner died is free at once."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserError(f"{what}: cannot create its lock file {lock} ({e.strerror})") from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("%s is in use by %s; waiting for it to finish", what, _owner(fd))
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
