"""MemAct's tools: their schemas, `search` over any Retriever, result formatting, and retriever building.

`search(query, topk)`: topk defaults to 5 and is clamped to [1, 20] (counted); a RetrievalError comes
back to the agent as an error tool message naming the endpoint, never as an exception.
"""

from __future__ import annotations

import importlib
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from memrl.services.base import Hit, RetrievalError, Retriever
from memrl.tools.calls import function_schema

log = logging.getLogger(__name__)

SEARCH, PRUNE = "search", "prune_context"
TOPK_DEFAULT, TOPK_MAX = 5, 20

SEARCH_SCHEMA = function_schema(
    SEARCH,
    "Search the document collection. Returns the best-matching passages, each with its title.",
    {
        "query": {"type": "string", "description": "What to look for."},
        "topk": {"type": "integer", "description": f"How many passages (default {TOPK_DEFAULT}, "
                                                   f"at most {TOPK_MAX}).", "minimum": 1, "maximum": TOPK_MAX},
    },
    ["query"],
)
PRUNE_SCHEMA = function_schema(
    PRUNE,
    "Remove tool results you no longer need from your context. Write what you learned from them into "
    "`memory` first: the memory stays in your context, the removed results do not.",
    {
        "memory": {"type": "string", "description": "A summary of everything useful you learned so far."},
        "delete_ids": {"type": "array", "items": {"type": "string"},
                       "description": "The ids of the tool results to remove (e.g. [\"r1\", \"r3\"])."},
    },
    ["memory", "delete_ids"],
)


def truncate_middle(text: str, max_chars: int, marker: str | None = None) -> tuple[str, bool]:
    """Head + marker + tail when `text` is over `max_chars`: marker None = memrl's (head max_chars//2, tail
    the rest, a marker naming the characters cut); a marker string = the public MemAct loop's cut
    (mem_agent_loop.py `_call_tool`, truncate side "middle"): head and tail max_chars//2 each around the
    given marker (Python's text[-0:] is the whole text, so max_chars 1 keeps all of it)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text, False
    if marker is not None:
        half = max_chars // 2
        return text[:half] + marker + text[-half:], True
    head = max_chars // 2
    tail = max_chars - head
    cut = len(text) - max_chars
    return f"{text[:head]}\n...[{cut} characters truncated]...\n{text[len(text) - tail:]}", True


def format_hits(query: str, hits: list[Hit]) -> str:
    """The text a search result shows the agent."""
    if not hits:
        return f'No passages found for "{query}".'
    parts = [f'Search results for "{query}":']
    for k, h in enumerate(hits, 1):
        d = h.document
        parts.append(f"({k}) {d.title}\n{d.text}" if d.title else f"({k}) {d.text}")
    return "\n\n".join(parts)


@dataclass
class SearchOutcome:
    """The tool message text; `error` is None, "arguments" or "retrieval"; `clamped`: topk was out of range."""

    text: str
    error: str | None = None
    clamped: bool = False
    hits: list[Hit] = field(default_factory=list)
    """The hits shown (a successful search)."""
    detail: str = ""
    """A failed retrieval's own message."""


TOPK_RULES = ("clamp", "published")


def published_topk(raw: Any) -> tuple[int, bool]:
    """(topk, changed) as the public MemAct search tool and service settle it (DCPO/tool_service/
    search_tool_single.py SearchTool.execute: `min(int(topk), 20)`, anything int() refuses -> the tool's
    default 5; search_search_services.py: a falsy topk (0) -> the service's default, 5 with its --topk
    default). A negative count (the service hands it to its index) is not reproduced: it becomes 1."""
    try:
        n = int(raw)
    except (TypeError, ValueError, OverflowError):
        return TOPK_DEFAULT, True
    if n == 0:
        return TOPK_DEFAULT, True
    if n < 0:
        return 1, True
    return min(n, TOPK_MAX), n > TOPK_MAX


async def run_search(retriever: Retriever, arguments: dict[str, Any], topk_rule: str = "clamp") -> SearchOutcome:
    """Run one search call; argument problems and retrieval failures come back as error text.

    topk_rule "clamp" (memrl): an integer (or digit string) clamped to [1, TOPK_MAX], anything else an
    argument error; "published": `published_topk`."""
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return SearchOutcome('Error: search needs a non-empty string "query".', "arguments")
    if topk_rule == "published":
        topk, clamped = published_topk(arguments.get("topk", TOPK_DEFAULT))
    else:
        topk = arguments.get("topk", TOPK_DEFAULT)
        if isinstance(topk, str) and topk.strip().isdigit():
            topk = int(topk)
        if isinstance(topk, bool) or not isinstance(topk, int):
            return SearchOutcome(f'Error: search "topk" must be an integer, got {topk!r}.', "arguments")
        clamped = not 1 <= topk <= TOPK_MAX
        topk = min(max(topk, 1), TOPK_MAX)
    try:
        hits = (await retriever.retrieve([query.strip()], topk))[0]
    except RetrievalError as e:
        log.warning("search failed: %s", e)
        return SearchOutcome(f"Error: search failed: {e}", "retrieval", clamped, detail=str(e))
    return SearchOutcome(format_hits(query.strip(), hits[:topk]), None, clamped, hits[:topk])


# ---------------------------------------------------------------- building the retriever
#
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
    from memrl.config import ConfigError

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


def build_retriever(kind: str, corpus: str | None, url: str | None) -> Any:
    """The retriever a config names.

    url -> a NEW memrl.services.client.HTTPRetriever(url), owned by the caller (memrl.runtime.Services
    builds one per run and closes it); kind registered -> that object; corpus with kind
    "bm25" -> memrl.services.retrieval.BM25Retriever.from_file(corpus), "keyword" -> memrl.services.keyword.KeywordRetriever
    (word overlap; tests), "module:attr" -> attr(corpus) when attr is a @retriever_factory; an in-process
    index is built once per (kind, corpus) and reused (it holds no client, no event loop). Imports are lazy.
    Mistakes raise ConfigError / DataError (one line, naming the workflow field).
    """
    from memrl.config import ConfigError
    from memrl.data.errors import DataError

    if url:
        return _import("memrl.services.client", "HTTPRetriever")(url)
    if kind in _REGISTERED:
        return _REGISTERED[kind]
    if kind not in BUILTIN_KINDS and ":" not in kind:
        raise ConfigError(f"workflow.retriever_kind={kind!r} is unknown: use bm25, keyword, module:attr of a "
                          "@retriever_factory, or a name given to register_retriever")
    factory = resolve_factory(kind) if ":" in kind else None  # refused before any corpus is read
    if not corpus:
        raise ConfigError("memact needs a retriever: set workflow.retriever_url, workflow.retriever_corpus (with "
                          f"retriever_kind bm25 or keyword), or workflow.retriever_scope=task; "
                          f"retriever_kind={kind!r} has no corpus")
    key = (kind, corpus)
    if key not in _CACHE:
        where = f"workflow.retriever_corpus={corpus}"
        try:
            if kind == "bm25":
                r = _import("memrl.services.retrieval", "BM25Retriever").from_file(corpus)
            elif kind == "keyword":
                from memrl.services.keyword import KeywordRetriever

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
    from memrl.data.errors import DataError
    from memrl.services.base import Document

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
