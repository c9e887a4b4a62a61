"""MemAct's tools: their schemas, `search` over any Retriever, result formatting. Retriever building is
memrl.services.registry; its public names are importable from here too (`@memrl.tools.search.retriever_factory`).

`search(query, topk)`: topk defaults to 5 and is clamped to [1, 20] (counted); a RetrievalError comes
back to the agent as an error tool message naming the endpoint, never as an exception.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from memrl.services.base import Hit, RetrievalError, Retriever
from memrl.services.registry import BUILTIN_KINDS as BUILTIN_KINDS  # re-exported: the public names
from memrl.services.registry import build_retriever as build_retriever
from memrl.services.registry import register_retriever as register_retriever
from memrl.services.registry import resolve_factory as resolve_factory
from memrl.services.registry import retriever_factory as retriever_factory
from memrl.services.registry import task_retriever as task_retriever
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
