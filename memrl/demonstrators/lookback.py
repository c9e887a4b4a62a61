"""The reference policy of the look-back task (memrl.data.synthetic_lookback), as a ScriptedEngine
script (prompt text in, reply text out)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from memrl.data.synthetic import VALUES, find_facts, memory_text
from memrl.demonstrators.prompts import prompt_pattern


@dataclass
class LookbackDemonstrator:
    """Reference policy for the look-back task, as a `ScriptedEngine` script.

    Memory step: new memory = the facts known to matter (the question's link, then the bridge key's
    fact) followed by this piece's facts, written as `memrl.data.synthetic.memory_text` (the words stay
    the document's tokens). Nothing else is kept: about the most an overwriting memory of this size can
    do. `workflow="rememr1"` wraps the memory in `<update>` and adds `<recall> Bridge</recall>` while the
    bridge key's value is unknown. Final step: `\\boxed{ value}` of the bridge key's fact, else a guess
    (the value of the last remembered fact). Build it with `for_config` to match a workflow config.
    """

    workflow: str
    memory_template: str
    final_template: str
    no_memory_text: str = "No previous memory"
    update_tag: str = "update"
    recall_tag: str = "recall"
    thinking: bool = False

    def __post_init__(self) -> None:
        if self.workflow not in ("memagent", "rememr1"):
            raise ValueError(f"LookbackDemonstrator.workflow must be memagent or rememr1, got {self.workflow!r}")
        recalled = ("recalled_memory",) if self.workflow == "rememr1" else ()
        self._mem = prompt_pattern(self.memory_template, ("problem", *recalled, "memory", "chunk"))
        self._fin = prompt_pattern(self.final_template, ("problem", *recalled, "memory"))

    @classmethod
    def for_config(cls, workflow: str, cfg: object, **kw: object) -> LookbackDemonstrator:
        """The demonstrator for a MemAgentConfig / ReMemR1Config (its templates, placeholder and tags)."""
        mem, fin = cfg.templates()  # type: ignore[attr-defined]
        tags = {k: getattr(cfg, k) for k in ("update_tag", "recall_tag") if hasattr(cfg, k)}
        return cls(
            workflow, mem.text, fin.text, getattr(cfg, "no_memory_text", "No previous memory"), **tags, **kw
        )  # type: ignore[arg-type]

    def __call__(self, prompt: str, call_index: int = 0) -> str:
        m = self._mem.search(prompt)
        if m:
            return self._memory_step(m)
        f = self._fin.search(prompt)
        if not f:
            raise ValueError(f"LookbackDemonstrator: prompt matches neither template: {prompt[:200]!r}")
        return self._final(f)

    def _known(self, m: re.Match[str]) -> tuple[str | None, int, list[tuple[str, str]], dict[str, str]]:
        groups = m.groupdict()
        q = _QUESTION.search(groups["problem"] or "")
        qkey, hops = (q.group(2), 2 if q.group(1) else 1) if q else (None, 1)
        seen = find_facts(groups["memory"] or "") + find_facts(groups.get("recalled_memory") or "")
        known: dict[str, str] = {}
        for k, v in seen + find_facts(groups.get("chunk") or ""):
            known.setdefault(k, v)
        return qkey, hops, seen, known

    def _memory_step(self, m: re.Match[str]) -> str:
        qkey, hops, _, known = self._known(m)
        relevant, missing = _relevant(qkey, hops, known)
        facts: list[tuple[str, str]] = []
        for f in relevant + find_facts(m.group("chunk")):
            if f not in facts:
                facts.append(f)
        text = memory_text(facts) if facts else self.no_memory_text
        if self.workflow == "memagent":
            return text
        think = "<thinking></thinking>" if self.thinking else ""
        u, r = self.update_tag, self.recall_tag
        recall = f"<{r}> {missing}</{r}>" if missing else ""
        return f"{think}<{u}>{text}</{u}>{recall}"

    def _final(self, f: re.Match[str]) -> str:
        qkey, hops, seen, known = self._known(f)
        relevant, missing = _relevant(qkey, hops, known)
        if relevant and missing is None:
            return f"\\boxed{{ {relevant[-1][1]}}}"
        guess = next((v for _, v in reversed(seen) if v in VALUES), VALUES[0])
        return f"\\boxed{{ {guess}}}"


_QUESTION = re.compile(r"what is (what )?([A-Z][a-z]+)( is)?")


def _relevant(qkey: str | None, hops: int, known: dict[str, str]) -> tuple[list[tuple[str, str]], str | None]:
    """Facts known to matter, and the bridge key whose value is still missing (two-hop only)."""
    if qkey is None or qkey not in known:
        return [], None
    out = [(qkey, known[qkey])]
    if hops == 2:
        mid = known[qkey]
        if mid not in known:
            return out, mid
        out.append((mid, known[mid]))
    return out, None
