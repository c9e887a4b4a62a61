"""The cache and the one downloader of pinned files (`memrl model fetch`, `memrl data fetch`).

- `cache_root()`: $MEMRL_CACHE, else ~/.cache/memrl.
- `download(url, dest, sha256, size)`: an HTTP(S) download into `dest`, resumable: the bytes go to
  `<dest>.partial`, and a later call asks the server for the rest (`Range: bytes=N-`); a server that ignores
  the range (200 instead of 206) is read from the start again. One process at a time per file: the partial
  file is guarded by an advisory lock (`<dest>.partial.lock`, flock), so a second process waits for the first
  and then finds the file done. The finished file must have exactly `size` bytes and the pinned sha256, or it
  is removed and the call fails; only then is it renamed to `dest`.

Errors are `DownloadError` (offline, refused, cut short, wrong checksum): one line naming the URL or file;
the callers add what the user can do instead (`--file`, `--wheel`).
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

CHUNK = 1 << 20
TIMEOUT_S = 60.0
"""Seconds a connection or a read may stall before the download stops (and can be resumed)."""


class DownloadError(Exception):
    """A download that failed; the message is one line naming the URL or file and why."""


def cache_root() -> Path:
    """Where fetched files and imported models are kept: $MEMRL_CACHE, else ~/.cache/memrl."""
    env = os.environ.get("MEMRL_CACHE", "").strip()
    return Path(env) if env else Path.home() / ".cache" / "memrl"


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def file_matches(path: Path, sha256: str, size: int | None = None) -> bool:
    """Whether `path` is a file of `size` bytes (when given) with this sha256."""
    try:
        if not path.is_file() or (size is not None and path.stat().st_size != size):
            return False
    except OSError:
        return False
    return sha256_file(path) == sha256


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)[:200]
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _fetch_rest(url: str, part: Path, size: int, quiet: bool) -> None:
    """Append the bytes `part` lacks (of `size`) from `url`; DownloadError when the server cannot give them."""
    have = part.stat().st_size if part.exists() else 0
    if have > size:  # longer than the pinned file: not the same file, start again
        part.unlink()
        have = 0
    if have == size:
        return
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-", "User-Agent": "memrl"})
    try:
        resp = urllib.request.urlopen(req, timeout=TIMEOUT_S)  # noqa: S310 - the URL is a pinned http(s) one
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left to send: the partial file is whole (checked by the caller)
            return
        raise DownloadError(f"{url}: {_reason(e)}") from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        raise DownloadError(f"{url}: {_reason(e)}") from None
    with resp:
        status = resp.status
        if status == 200 and have:  # the server ignored the range: read it all again
            have = 0
        elif status not in (200, 206):
            raise DownloadError(f"{url}: HTTP {status}")
        if not quiet:
            how = f"resuming at {have:,} of {size:,} bytes" if have else f"{size:,} bytes"
            print(f"downloading {url} ({how})", file=sys.stderr, flush=True)
        mode = "ab" if have else "wb"
        with open(part, mode) as out:
            got = have
            try:
                while block := resp.read(CHUNK):
                    got += len(block)
                    if got > size:
                        raise DownloadError(f"{url}: the server sent more than the pinned {size:,} bytes")
                    out.write(block)
            except (OSError, ValueError, http.client.HTTPException) as e:  # cut or stalled: keep the bytes so far
                out.flush()
                raise DownloadError(f"{url}: the download stopped after {got:,} of {size:,} bytes ({_reason(e)}); "
                                    "run the command again to resume") from None
    if part.stat().st_size < size:
        raise DownloadError(f"{url}: the download stopped after {part.stat().st_size:,} of {size:,} bytes (the "
                            "server closed the connection); run the command again to resume")


def download(url: str, dest: str | os.PathLike, sha256: str, size: int, quiet: bool = False) -> Path:
    """`url` into `dest` (see the module's doc): the path, or DownloadError. A `dest` that already holds the
    pinned bytes is returned untouched."""
    dest = Path(dest)
    if file_matches(dest, sha256, size):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".partial")
    fd = os.open(dest.with_name(dest.name + ".partial.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"waiting for another process downloading {dest.name}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
            if file_matches(dest, sha256, size):
                return dest
        _fetch_rest(url, part, size, quiet)
        got = sha256_file(part)
        if got != sha256:
            part.unlink()
            raise DownloadError(f"{url}: the downloaded file's sha256 is {got}, not the pinned {sha256} "
                                "(removed it)")
        os.replace(part, dest)
        return dest
    finally:
        os.close(fd)
