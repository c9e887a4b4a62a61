"""The retrieval corpus: a deduplicated paragraph JSONL built from HotpotQA / 2Wiki, and its reader.

One line per paragraph: `{"id", "title", "text"}`. The id is a hash of title and text, so it is stable
across runs, file orders and sources; a paragraph that occurs in many questions is kept once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memrl.data.checks import bad_text, text_problem
from memrl.data.errors import DataError
from memrl.data.files import open_text, write_jsonl
from memrl.types import Document, Task

SOURCES = ("hotpotqa", "2wiki")


def join_sentences(sentences: Sequence[str]) -> str:
    """A paragraph's text: HotpotQA sentences carry their own leading space, 2Wiki's need one added."""
    out = ""
    for s in sentences:
        if out and not out[-1].isspace() and s and not s[0].isspace():
            out += " "
        out += s
    return out.strip()


def paragraph_id(title: str, text: str) -> str:
    """A stable id: the first 16 hex digits of sha1(title NUL text)."""
    return hashlib.sha1(f"{title}\0{text}".encode()).hexdigest()[:16]


@dataclass
class CorpusStats:
    """What `build_corpus` saw: questions, paragraphs read, paragraphs kept, empty ones dropped."""

    questions: int = 0
    paragraphs: int = 0
    kept: int = 0
    empty: int = 0


def build_corpus(tasks: Iterable[Task], stats: CorpusStats | None = None) -> list[Document]:
    """Documents from every paragraph in `meta["paragraphs"]` of the tasks, first occurrence first."""
    st = stats if stats is not None else CorpusStats()
    seen: dict[str, Document] = {}
    for t in tasks:
        st.questions += 1
        paragraphs = t.meta.get("paragraphs")
        if not isinstance(paragraphs, list):
            raise DataError(f"task {t.task_id}: no meta['paragraphs']; load it with the hotpotqa or 2wiki loader")
        for p in paragraphs:
            st.paragraphs += 1
            title, text = p["title"].strip(), join_sentences(p["sentences"])
            if not text:
                st.empty += 1  # counted, reported by the command: an empty passage cannot be retrieved
                continue
            pid = paragraph_id(title, text)
            if pid not in seen:
                seen[pid] = Document(id=pid, title=title, text=text)
    st.kept = len(seen)
    return list(seen.values())


def write_corpus(path: str | os.PathLike[str], docs: Iterable[Document]) -> int:
    """Write documents as corpus JSONL; returns the count."""
    return write_jsonl(path, ({"id": d.id, "title": d.title, "text": d.text} for d in docs))


def load_corpus(path: str | os.PathLike[str]) -> list[Document]:
    """Documents from a corpus JSONL; a bad line raises DataError naming file and line, duplicate ids too."""
    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"corpus file {path} does not exist")
    docs: list[Document] = []
    ids: dict[str, int] = {}
    with open_text(path, errors="surrogateescape") as f:  # a byte that is not UTF-8 is named by its line
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {lineno}"
            problem = bad_text(line)
            if problem:
                raise DataError(f"{where}: {problem}")
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON: {e.msg}") from e
            problem = text_problem(rec)
            if problem:
                raise DataError(f"{where}: {problem}")
            if not isinstance(rec, dict):
                raise DataError(f"{where}: expected an object {{id, title, text}}, got {type(rec).__name__}")
            for key in ("id", "text"):
                if not isinstance(rec.get(key), str) or not rec[key]:
                    raise DataError(f"{where}: field '{key}' must be a non-empty string")
            title = rec.get("title", "")
            if not isinstance(title, str):
                raise DataError(f"{where}: field 'title' must be a string, got {type(title).__name__}")
            if rec["id"] in ids:
                raise DataError(f"{where}: duplicate id {rec['id']!r} (first at line {ids[rec['id']]})")
            ids[rec["id"]] = lineno
            docs.append(Document(id=rec["id"], title=title, text=rec["text"]))
    if not docs:
        raise DataError(f"{path}: the corpus is empty")
    return docs
