"""Building the retriever a config names (`workflow.retriever_kind`, `retriever_corpus`, `retriever_url`):
memrl's own kinds, names given to `register_retriever`, and `module:attr` of a `@retriever_factory`.

Used by memrl.services.session.Services (one retriever per source for a run) and MemAct's workflow (the
per-task index, `retriever_scope=task`); memrl.tools.search re-exports the public names
(`@memrl.tools.search.retriever_factory` is how a user's module marks its factory).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from memrl.config import ConfigError
from memrl.data.errors import DataError
from memrl.services.base import RetrievalError
from memrl.services.keyword import KeywordRetriever
from memrl.types import Document

# `retriever_kind` comes from configs and presets. Presets are trusted input, but a name that resolves to
# Python code is still restricted: "module:attr" must name an object marked with @retriever_factory (an
# identity registry, checked before anything is called); any other callable (os:system, builtins:exec)
# is refused with a one-line ConfigError and never called.

_REGISTERED: dict[str, Any] = {}
_CACHE: dict[tuple[Any, ...], Any] = {}  # in-process indexes by (kind, corpus): no clients, no loops
_FACTORIES: list[Any] = []  # objects marked by @retriever_factory, compared by identity
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
BUILTIN_KINDS = ("bm25", "keyword")


def register_retriever(name: str, retriever: Any) -> None:
    """Make an object satisfying Retriever available to `memact` as `retriever_kind=NAME` (tests, notebooks)."""
    _REGISTERED[name] = retriever


def retriever_factory(fn: Any) -> Any:
    """Mark `fn` (a class or function taking the corpus path, returning a Retriever) as one that
    `retriever_kind="module:attr"` may call. Nothing else a config names is ever called."""
    if not callable(fn):
        raise TypeError(f"@retriever_factory needs a class or function, got {type(fn).__name__}")
    if not any(f is fn for f in _FACTORIES):
        _FACTORIES.append(fn)
    return fn


def resolve_factory(kind: str) -> Any:
    """The @retriever_factory object "module:attr" names; ConfigError (nothing called) otherwise.

    Importing the module runs its top-level code, as any import does; the attribute is read from the
    module's namespace (no __getattr__ hook runs) and must be a marked factory by identity."""
    where = f"workflow.retriever_kind={kind!r}"
    if not _IMPORT_PATH.match(kind):
        raise ConfigError(f"{where}: expected bm25, keyword, a registered name or module:attr of a "
                          "@retriever_factory")
    mod_name, _, attr = kind.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"{where}: cannot import module {mod_name!r} ({e})") from e
    obj = vars(module).get(attr)
    if obj is None:
        raise ConfigError(f"{where}: module {mod_name!r} has no attribute {attr!r}")
    if not any(f is obj for f in _FACTORIES):
        raise ConfigError(f"{where} is not a retriever factory: only objects marked with "
                          "@memrl.tools.search.retriever_factory may be named (nothing was called)")
    return obj


def retriever_problem(cfg: Any, workflow: str) -> str | None:
    """What a workflow config that searches one corpus for every task (retriever_scope=corpus) lacks to build
    its retriever (`build_retriever`), None when it has a source or does not search: checked before any model
    loads, so the first search of the first step does not find it."""
    if getattr(cfg, "retriever_scope", "task") != "corpus" or not hasattr(cfg, "retriever_kind"):
        return None
    kind = cfg.retriever_kind
    if cfg.retriever_url or cfg.retriever_corpus or kind in _REGISTERED or ":" in kind:
        return None
    return (f"workflow={workflow} needs a retriever: set workflow.retriever_url, workflow.retriever_corpus (with "
            "retriever_kind bm25 or keyword), or workflow.retriever_scope=task (each task searches its own "
            "documents)")


def build_retriever(kind: str, corpus: str | None, url: str | None) -> Any:
    """The retriever a config names.

    url -> a NEW memrl.services.client.HTTPRetriever(url), owned by the caller (memrl.services.session.Services
    builds one per run and closes it); kind registered -> that object; corpus with kind
    "bm25" -> memrl.services.retrieval.BM25Retriever.from_file(corpus), "keyword" -> memrl.services.keyword.KeywordRetriever
    (word overlap; tests), "module:attr" -> attr(corpus) when attr is a @retriever_factory; an in-process
    index is built once per (kind, corpus) and reused (it holds no client, no event loop). The HTTP client's and
    BM25's modules are imported when first used.
    Mistakes raise ConfigError / DataError (one line, naming the workflow field).
    """
    if url:
        return _import("memrl.services.client", "HTTPRetriever")(url)
    if kind in _REGISTERED:
        return _REGISTERED[kind]
    if kind not in BUILTIN_KINDS and ":" not in kind:
        raise ConfigError(f"workflow.retriever_kind={kind!r} is unknown: use bm25, keyword, module:attr of a "
                          "@retriever_factory, or a name given to register_retriever")
    factory = resolve_factory(kind) if ":" in kind else None  # refused before any corpus is read
    if not corpus:
        raise ConfigError("a retriever is needed: set workflow.retriever_url, workflow.retriever_corpus (with "
                          f"retriever_kind bm25 or keyword), or workflow.retriever_scope=task; "
                          f"retriever_kind={kind!r} has no corpus")
    key = (kind, corpus)
    if key not in _CACHE:
        where = f"workflow.retriever_corpus={corpus}"
        try:
            if kind == "bm25":
                r = _import("memrl.services.retrieval", "BM25Retriever").from_file(corpus)
            elif kind == "keyword":
                r = KeywordRetriever.from_jsonl(corpus)
                if not r.documents:
                    raise DataError(f"{corpus}: the corpus is empty")
            else:
                r = factory(corpus)
        except FileNotFoundError as e:
            raise DataError(f"{where}: no such file ({e.filename or corpus})") from e
        except IsADirectoryError as e:
            raise DataError(f"{where} is a directory, not a corpus JSONL") from e
        except (ValueError, RetrievalError, OSError) as e:  # DataError is a ValueError
            raise DataError(f"{where}: {e}") from e
        _CACHE[key] = r
    return _CACHE[key]


def task_retriever(task: Any) -> Any:
    """BM25 over the task's own documents, `task.meta["documents"]`: texts (ids "<task_id>-<i>") or
    {id, title, text} rows. Built per trajectory (a few dozen documents index in about a millisecond)."""
    docs = task.meta.get("documents")
    if not isinstance(docs, list) or not docs:
        raise DataError(f"task {task.task_id!r}: workflow.retriever_scope=task needs task.meta['documents'], a "
                        "non-empty list of texts or {id, title, text} rows")
    parsed = []
    for i, d in enumerate(docs):
        if isinstance(d, str):
            parsed.append(Document(f"{task.task_id}-{i}", "", d))
        elif isinstance(d, dict) and isinstance(d.get("text"), str):
            parsed.append(Document(str(d.get("id", f"{task.task_id}-{i}")), str(d.get("title") or ""), d["text"]))
        else:
            raise DataError(f"task {task.task_id!r}: meta.documents[{i}] must be a text or a row with a 'text' "
                            f"string, got {type(d).__name__}")
    return _import("memrl.services.retrieval", "BM25Retriever")(parsed)


def _import(module: str, attr: str) -> Any:
    """One of memrl's own retriever classes (fixed names, never from a config)."""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"retriever {module}.{attr} is not available in this installation: {e}") from e
