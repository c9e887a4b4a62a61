"""The scripted optimal reading agent of the synthetic one-fact task (memrl.data.synthetic) for MemAgent and
InfMem, as a ScriptedEngine script (prompt text in, reply out): it keeps the asked fact when a section (or
the retrieved passages) shows it and answers from the memory; under InfMem its planner retrieves the asked
key (top_k 1) until the memory holds the fact, then says STOP.

Prompts are read back through the workflow's own templates (memrl.demonstrators.prompts), so the agent
plays any template text that keeps the fields; `ReadingDemonstrator.for_config` builds it from a workflow config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from memrl.data.synthetic import asked_key, find_facts, memory_text
from memrl.demonstrators.prompts import prompt_pattern


def retrieve_reply(key: str, top_k: int = 1, tool_name: str = "retrieve") -> str:
    """The plan call's retrieval of `key`, as a hermes tool call."""
    call = {"name": tool_name, "arguments": {"query": key, "top_k": top_k}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def answer_reply(value: str) -> str:
    """The final call's answer; "{ red}" keeps the value the same token (" red") as in the document."""
    return f"\\boxed{{ {value}}}"


@dataclass
class ReadingDemonstrator:
    """MemAgent / InfMem optimal reader on one-fact synthetic tasks. Memory call: the memory becomes the asked fact
    ("- Kalo is red") once the retrieved passages, the section or the old memory show it, else the old memory
    is kept. Plan call (InfMem, `plan_template` given): STOP when the memory holds the asked fact, else a
    retrieve call of the asked key with `top_k`. Final call: the memory's value of the asked key, or
    `unknown_text` when it holds none."""

    memory_template: str
    final_template: str
    plan_template: str | None = None
    """None: the MemAgent workflow (no plan calls)."""
    fact_sep: str | None = "is"
    top_k: int = 1
    stop_marker: str = "STOP"
    tool_name: str = "retrieve"
    unknown_text: str = "unknown"

    def __post_init__(self) -> None:
        names = ("problem", "history", "retrieved", "chunk", "memory") if self.plan_template is not None \
            else ("problem", "memory", "chunk")
        self._mem = prompt_pattern(self.memory_template, tuple(n for n in names if "{" + n + "}" in
                                                               self.memory_template))
        self._plan = prompt_pattern(self.plan_template, ("problem", "history", "memory")) \
            if self.plan_template is not None else None
        self._fin = prompt_pattern(self.final_template, ("problem", "memory"))

    @classmethod
    def for_config(cls, workflow: str, cfg: Any, fact_sep: str | None = "is", top_k: int = 1) -> ReadingDemonstrator:
        """The demonstrator in the templates of `cfg` (a memagent or infmem workflow config)."""
        if workflow == "infmem":
            plan, mem, fin = cfg.templates()
            return cls(mem.text, fin.text, plan.text, fact_sep=fact_sep, top_k=top_k, stop_marker=cfg.stop_marker,
                       tool_name=cfg.tool_name)
        if workflow == "memagent":
            mem, fin = cfg.templates()
            return cls(mem.text, fin.text, None, fact_sep=fact_sep, top_k=top_k)
        raise ValueError(f"ReadingDemonstrator: workflow must be memagent or infmem, got {workflow!r}")

    def _value(self, text: str, key: str) -> str | None:
        return next((v for k, v in find_facts(text, self.fact_sep) if k == key), None)

    def __call__(self, prompt_text: str, call_index: int = 0) -> str:
        m = self._mem.search(prompt_text)
        if m:
            key, _ = asked_key(m.group("problem"))
            memory = m.group("memory")
            seen = self._value(" ".join(m.groupdict().get(f) or "" for f in ("retrieved", "chunk")) + " " + memory,
                               key)
            return memory_text([(key, seen)], self.fact_sep) if seen else memory
        p = self._plan.search(prompt_text) if self._plan is not None else None
        if p:
            key, _ = asked_key(p.group("problem"))
            if self._value(p.group("memory"), key):
                return self.stop_marker
            return retrieve_reply(key, self.top_k, self.tool_name)
        f = self._fin.search(prompt_text)
        if not f:
            raise ValueError(f"ReadingDemonstrator: prompt matches none of its templates: {prompt_text[:200]!r}")
        key, _ = asked_key(f.group("problem"))
        return answer_reply(self._value(f.group("memory"), key) or self.unknown_text)
