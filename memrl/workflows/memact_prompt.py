"""MemAct's first prompt from a task's own messages (`workflow.prompt_source`), rendered with the tool schemas
through the chat template, and the text the published search tool writes."""

from __future__ import annotations

import re
from typing import Any

from memrl.data.errors import DataError
from memrl.tools import calls as tc
from memrl.types import Task
from memrl.workflows.memact_config import MemActConfig


def row_prompt(task: Task, cfg: MemActConfig) -> list[dict[str, str]] | None:
    """The task's own prompt messages when they drive the agent (`cfg.prompt_source`), else None."""
    msgs = task.meta.get("prompt")
    if cfg.prompt_source == "template" or (cfg.prompt_source == "auto" and not msgs):
        return None
    if not msgs:  # a data mistake: one line through the rollout runner and the CLI, not a RolloutError
        raise DataError(f"workflow.prompt_source=row: task {task.task_id!r} has no prompt messages (meta.prompt; "
                        "a file row's 'prompt' field, as in the published parquet layout); use such a file "
                        "or workflow.prompt_source=auto")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in msgs]


def noprune_messages(msgs: list[dict[str, str]], cfg: MemActConfig) -> list[dict[str, str]]:
    """The row's messages with the pruning instructions cut out (prune_context withheld), as the published
    loop does: the system message up to `row_noprune_system_cut`, the user message after `row_noprune_user_cut`."""
    out = [dict(m) for m in msgs]
    for m in out:
        if m["role"] == "system" and cfg.row_noprune_system_cut and cfg.row_noprune_system_cut in m["content"]:
            m["content"] = m["content"].split(cfg.row_noprune_system_cut)[0]
        elif m["role"] == "user" and cfg.row_noprune_user_cut and cfg.row_noprune_user_cut in m["content"]:
            m["content"] = m["content"].split(cfg.row_noprune_user_cut)[-1]
    return out


def render_messages(tok: Any, msgs: list[dict[str, str]], tools: list[dict[str, Any]],
                    template_kwargs: dict[str, Any] | None = None, call_format: str = "hermes") -> tuple[str, bool]:
    """(the messages through the chat template with `tools=`, without the generation prompt; whether the
    template took the tools). A template that ignores `tools=` gets the tools block (`call_format`'s
    wording) appended to the system message (one is added first when there is none), as
    memrl.tools.calls.render_system does. `template_kwargs`: extra template variables (enable_thinking)."""
    kw = dict(template_kwargs or {})
    plain = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **kw)
    try:
        with_tools = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=False, **kw)
    except Exception:  # noqa: BLE001 - a template may reject the argument; use the fallback
        with_tools = plain
    if with_tools != plain:
        return with_tools, True
    msgs = [dict(m) for m in msgs]
    block = tc.tools_fallback_text(tools, call_format)
    if msgs[0]["role"] == "system":
        msgs[0]["content"] += block
    else:
        msgs.insert(0, {"role": "system", "content": block.lstrip("\n")})
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, **kw), False


def unescape_unicode(text: str) -> str:
    """What the public search tool does to its JSON text (search_tool_single.py): every \\uXXXX escape
    becomes its character, escaped surrogate pairs become one code point."""
    out = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)
    try:
        return out.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeError:
        return out
