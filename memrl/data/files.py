"""Shared readers and writers for data files: JSON (a list), JSONL, parquet, each optionally .xz/.gz/.bz2.

Every record reader yields `(row_number, record)`; `parse_records` turns records into Tasks, naming the file
and row of a malformed record (or, with skip_bad, logging how many were skipped: never silent loss).
The loaders (memrl.data.hotpotqa, ruler, ...) build on these; memrl.data.io picks a loader for a file
and re-exports these names. Dependencies run one way: io -> loaders -> files -> errors.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import logging
import lzma
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from memrl.data.checks import DuplicateIds, gold_problem, text_problem
from memrl.data.errors import DataError
from memrl.types import DataModelError, Task

log = logging.getLogger("memrl.data.io")  # the name these readers always logged under

_COMPRESSORS: dict[str, Callable[..., IO[Any]]] = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}


@dataclass
class ReadStats:
    """What one `parse_records` call read: rows seen, rows skipped and the first few reasons."""

    path: str
    rows: int = 0
    skipped: int = 0
    reasons: list[str] = field(default_factory=list)


def file_format(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """(format, compression) from the file name: format is json, jsonl or parquet."""
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    comp = suffixes[-1] if suffixes and suffixes[-1] in _COMPRESSORS else None
    if comp:
        suffixes = suffixes[:-1]
    ext = suffixes[-1] if suffixes else ""
    if ext in (".jsonl", ".ndjson"):
        return "jsonl", comp
    if ext == ".json":
        return "json", comp
    if ext in (".parquet", ".pq"):
        if comp:
            raise DataError(f"{path}: compressed parquet is not supported (parquet compresses itself)")
        return "parquet", None
    raise DataError(f"{path}: unknown data file type; expected .json, .jsonl or .parquet (optionally .xz/.gz/.bz2)")


def open_text(path: str | os.PathLike[str], mode: str = "rt", errors: str = "strict") -> IO[str]:
    """Open a (possibly compressed) text file for reading or writing, UTF-8."""
    opener = _COMPRESSORS.get(Path(path).suffix.lower())
    if opener is not None:
        return opener(path, mode, encoding="utf-8", errors=errors)  # type: ignore[call-arg]
    return open(path, mode, encoding="utf-8", errors=errors)


def iter_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """Yield (row number from 0, record) for every record of a JSON list, JSONL or parquet file.

    A `.json` file whose text does not start with '[' is read as JSON lines (many hub exports are).
    A file that cannot be decoded (corrupt or truncated compression, not UTF-8) is a DataError naming it.
    """
    path = str(path)
    if not os.path.exists(path):
        raise DataError(f"data file {path} does not exist")
    if os.path.isdir(path):
        raise DataError(f"data file {path} is a directory, not a file")
    fmt, comp = file_format(path)
    try:
        yield from _records(path, fmt)
    except (lzma.LZMAError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, OSError) as e:
        if isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile) and comp != ".bz2":
            raise  # a real I/O error (permissions, disk), not a decoding one
        raise DataError(f"{path}: {_decode_problem(e, comp)}") from e


def _decode_problem(e: BaseException, comp: str | None) -> str:
    """What is wrong with a file that failed to decode, in words."""
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{e.object[e.start]:02x}); expected UTF-8 JSON"
    name = {".xz": "xz", ".gz": "gzip", ".bz2": "bzip2"}.get(comp or "", "compressed")
    if isinstance(e, EOFError):
        return f"truncated {name} file (it ends before the end-of-stream marker)"
    return f"not a valid {name} file ({e})"


def _one_line(text: str) -> str:
    """A library's message as one printable line (pyarrow's can hold newlines and raw bytes)."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _records(path: str, fmt: str) -> Iterator[tuple[int, Any]]:
    if fmt == "parquet":
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types
            raise DataError(f"{path}: not a readable parquet file: {e}") from e
        row = 0
        groups = pf.metadata.num_row_groups
        for group in range(groups):
            first = row
            try:
                # one row group at a time, so a damaged page is named by its row group
                for batch in pf.iter_batches(batch_size=256, row_groups=[group]):
                    for rec in batch.to_pylist():
                        yield row, rec
                        row += 1
            except (pa.ArrowException, OSError) as e:  # a damaged data page (pyarrow raises OSError for some)
                end = first + pf.metadata.row_group(group).num_rows - 1
                raise DataError(f"{path}: parquet data damaged in row group {group} of {groups} "
                                f"(rows {first}-{end}): {_one_line(str(e))}") from e
        return
    with open_text(path) as f:
        if fmt == "json":
            head = f.read(4096)
            first = head.lstrip()[:1]
            rest = f.read()
            text = head + rest
            if first == "[":
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
                yield from enumerate(data)
                return
            lines: Iterable[str] = io.StringIO(text)
        else:
            lines = f
        row = 0
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                rec = DataError(f"{path}: row {row} (line {lineno}) is not valid JSON: {e.msg}")
            yield row, rec
            row += 1


def parse_records(
    path: str | os.PathLike[str],
    parse: Callable[[Any, str], Task | list[Task]],
    skip_bad: bool = False,
    limit: int | None = None,
    stats: ReadStats | None = None,
) -> list[Task]:
    """Tasks from every record of `path` via `parse(record, where)`; `where` names file and row for errors.

    `parse` returns one Task, or a list of them for a record holding several questions (a LoCoMo
    conversation); `limit` counts tasks. A malformed record raises DataError naming file, row and what is
    wrong; with skip_bad=True it is skipped (all its tasks) and the count (with the first reasons) is logged
    at WARNING level. Malformed includes a task that can never be scored or whose id an earlier row used
    (memrl.data.checks).
    """
    st = stats if stats is not None else ReadStats(str(path))
    tasks: list[Task] = []
    ids = DuplicateIds()
    for row, rec in iter_records(path):
        if limit is not None and len(tasks) >= limit:
            break
        st.rows += 1
        where = f"{path}: row {row}"
        try:
            if isinstance(rec, DataError):
                raise rec
            problem = text_problem(rec)  # a lone surrogate would pass here and fail in a tokenizer later
            if problem:
                raise DataError(f"{where}: {problem}")
            parsed = parse(rec, where)
            batch = parsed if isinstance(parsed, list) else [parsed]
            for task in batch:
                problem = gold_problem(task) or ids.problem(task.task_id, row)  # memrl.data.checks
                if problem:
                    raise DataError(f"{where}: {problem}")
            tasks.extend(batch[: None if limit is None else limit - len(tasks)])
        except (DataError, DataModelError, KeyError, TypeError, ValueError, IndexError) as e:
            msg = str(e) if isinstance(e, DataError) else f"{where}: {type(e).__name__}: {e}"
            if not skip_bad:
                raise DataError(msg) from e
            st.skipped += 1
            if len(st.reasons) < 5:
                st.reasons.append(msg)
    if st.skipped:
        log.warning(
            "%s: skipped %d of %d malformed rows (skip_bad); first: %s",
            path, st.skipped, st.rows, " | ".join(st.reasons),
        )
    return tasks


def row_of(where: str) -> int:
    """The row number inside a `where` string made by parse_records ("<path>: row <n>")."""
    return int(where.rsplit(" ", 1)[-1])


def require(rec: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """rec[key], checked to be of `kind`; DataError naming where, the field and what was expected."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object (dict), got {type(rec).__name__}")
    if key not in rec:
        raise DataError(f"{where}: missing field '{key}'")
    val = rec[key]
    if not isinstance(val, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DataError(f"{where}: field '{key}' must be {names}, got {type(val).__name__}")
    return val


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """`with replacing(path) as tmp:` write `tmp` (a hidden sibling with the same suffixes, so compression
    follows the name); on success it is renamed onto `path`, on any error removed: a full disk or a kill
    never leaves a partial file under the final name, and an older file there stays whole."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{os.getpid()}-{final.name}")
    try:
        yield tmp
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike[str], records: Iterable[Any], indent: int | None = None) -> int:
    """Write records as one JSON list, streaming (records may be a generator); returns the count.
    Atomic (`replacing`), as every writer here."""
    n = 0
    with replacing(path) as tmp, open_text(tmp, "wt") as f:
        f.write("[")
        for rec in records:
            f.write(",\n" if n else "\n")
            f.write(json.dumps(rec, ensure_ascii=False, indent=indent))
            n += 1
        f.write("\n]\n" if n else "]\n")
    return n


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Any]) -> int:
    """Write records as JSON lines; returns the count."""
    n = 0
    with replacing(path) as tmp, open_text(tmp, "wt") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


def write_parquet(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> int:
    """Write records (dicts with the same keys) as one parquet file; returns the count."""
    table = pa.Table.from_pylist(records)
    with replacing(path) as tmp:
        pq.write_table(table, str(tmp))
    return len(records)


def write_records(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> int:
    """Write records in the format the file name says (json, jsonl or parquet)."""
    fmt, _ = file_format(path)
    if fmt == "parquet":
        return write_parquet(path, records)
    if fmt == "jsonl":
        return write_jsonl(path, records)
    return write_json(path, records)


def first_record(path: str | os.PathLike[str]) -> Any:
    """The first record of a file (None when it has none); a malformed first line is a DataError."""
    for _, rec in iter_records(path):
        if isinstance(rec, DataError):
            raise rec
        return rec
    return None
