"""Index-only eval files: contexts stored as document indices, rebuilt from the source dev set.

MemAgent writes its largest RULER-HQA sets (12800 documents and up; taskutils/memory_data/
different_docs_eval.py: generate_index_only) and the RULER QA sets past 2M tokens (synthetic/qa.py) with
`context` as a list of integers instead of text. The integers index a document list built from the dev
file (taskutils/memory_data/processing.py: read_hotpotqa / read_squad):

- HotpotQA / 2Wiki: every paragraph of every question as "{title}\\n{sentences joined with ''}",
  deduplicated and sorted (Python string order, i.e. by code point).
- SQuAD (v1/v2 JSON, `{"data": [...]}`): every paragraph's `context` string, deduplicated and sorted.

The context is rebuilt as the evaluator does (memory_eval/ruler_hqa_over1m.py: set_context):
"Document {i}:\\n{document}" for i from 1 in the file's index order, joined by one blank line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from memrl.data.errors import DataError
from memrl.data.files import open_text
from memrl.data.hotpotqa import load_hotpotqa, paragraph_text
from memrl.data.kinds import detect_kind
from memrl.data.twowiki import load_twowiki

_DATASET_NAMES = {"hotpotqa": "hotpotqa", "2wiki": "2wikimultihopqa", "squad": "squad"}


@dataclass(frozen=True)
class DocumentList:
    """The sorted distinct documents of a dev file, and which dataset it is."""

    path: str
    dataset: str
    docs: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.docs)


def document_list(docs_from: str | os.PathLike[str]) -> DocumentList:
    """The document list of a HotpotQA / 2Wiki (either layout, any supported file type) or SQuAD file."""
    p = str(docs_from)
    if not os.path.isfile(p):
        raise DataError(f"docs_from file {p} does not exist; it must be the dev file the index-only contexts "
                        "index (HotpotQA hotpot_dev_distractor_v1.json for MemAgent's sets)")
    st = os.stat(p)
    return _cached_list(os.path.abspath(p), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=4)
def _cached_list(path: str, size: int, mtime_ns: int) -> DocumentList:
    squad = _squad_paragraphs(path)
    if squad is not None:
        return DocumentList(path, "squad", tuple(sorted(set(squad))))

    kind = detect_kind(path)
    if kind not in ("hotpotqa", "2wiki"):
        raise DataError(f"docs_from file {path} is a {kind} file; expected the HotpotQA / 2Wiki dev set "
                        "(or SQuAD) whose documents the index-only contexts index")
    load = load_hotpotqa if kind == "hotpotqa" else load_twowiki
    docs = {f"{p['title']}\n{paragraph_text(p['sentences'])}" for t in load(path)
            for p in t.meta["paragraphs"]}
    return DocumentList(path, _DATASET_NAMES[kind], tuple(sorted(docs)))


def _squad_paragraphs(path: str) -> list[str] | None:
    """Paragraph contexts of a SQuAD file, or None when the file is not one (a JSON object with 'data')."""
    if not path.lower().split(".xz")[0].split(".gz")[0].split(".bz2")[0].endswith(".json"):
        return None
    with open_text(path) as f:
        head = f.read(1)
        while head.isspace():
            head = f.read(1)
        if head != "{":
            return None
        try:
            data = json.loads(head + f.read())
        except json.JSONDecodeError:
            return None  # JSON lines: a HotpotQA / 2Wiki export
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None
    try:
        return [p["context"] for d in data["data"] for p in d["paragraphs"]]
    except (KeyError, TypeError) as e:
        raise DataError(f"docs_from file {path}: SQuAD layout expected data[].paragraphs[].context ({e})") from e


def rebuild_context(indices: Sequence[int], docs: DocumentList, where: str) -> str:
    """The context text of an index-only row; an index outside the list is a DataError naming the row."""
    n = len(docs)
    for j, i in enumerate(indices):
        if not 0 <= i < n:
            raise DataError(f"{where}: context[{j}] = {i} is out of range; {docs.path} has {n} distinct "
                            f"documents (indices 0..{n - 1}); is it the dev file this eval file was built from?")
    return "\n\n".join(f"Document {k + 1}:\n{docs.docs[i]}" for k, i in enumerate(indices))


def missing_docs_error(path: str, row: int) -> DataError:
    """The one error for an index-only file read without the dev file."""
    return DataError(
        f"{path}: row {row}: field 'context' holds document indices (an index-only eval file); give the dev "
        "file they index: `--docs-from FILE` (memrl eval, memrl data), the `docs_from=FILE` override "
        "(memrl eval) or `data.docs_from=FILE` (memrl train)"
    )
