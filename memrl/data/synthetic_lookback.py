"""A synthetic task where looking back matters (ReMemR1's motivation, arXiv 2509.23040).

The question is a two-hop bridge, "what is what Kalo is". The answer fact "Miran is red" is planted in
an EARLIER piece than the link "Kalo is Miran" that makes it relevant. While reading the answer fact
nothing marks it as relevant (every piece holds facts about unrelated keys too), so a memory that is
overwritten with what looks relevant, within a small budget, has usually dropped it by the time the link
arrives. A ReMemR1 agent can issue `<recall>Miran</recall>` when it reads the link and get back the past
memory that still held "Miran is red".

Same building blocks as `memrl.data.synthetic` (keys, values and filler are single tokens of the demo
tokenizer, a piece is exactly `chunk_words` tokens, so token chunks line up with pieces); length is
counted in pieces. Exact-match single-word answers. Seeded: the same (config, seed, index) always gives
the same task.

`LookbackOracle` is a scripted policy (for `memrl.testing.ScriptedEngine`) that keeps the facts known
to matter plus the current piece's facts (about the best an overwriting memory of that size can do),
and its ReMemR1 form that recalls a bridge key it has not kept. It makes SFT traces and references.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from memrl.data.synthetic import FILLER, KEYS, QUESTION_2, VALUES, find_facts, memory_text
from memrl.types import Task


@dataclass
class LookbackConfig:
    """Shape of the look-back tasks; length is `num_chunks` pieces of `chunk_words` tokens."""

    num_chunks: int = 4
    """Pieces per document (>= 2: the answer fact and the link need different pieces)."""
    chunk_words: int = 24
    """Words (= tokens of the demo tokenizer) per piece; set the workflow's chunk_tokens to this."""
    facts_per_chunk: int = 1
    """Facts per piece; the answer fact and the link take one slot each, distractors fill the rest."""
    lookback_fraction: float = 1.0
    """Fraction of tasks whose answer fact comes before the link (the rest: at or after it)."""
    num_keys: int = 256
    """Keys drawn from the first num_keys of memrl.data.synthetic.KEYS."""
    num_values: int = len(VALUES)
    """Answer values drawn from the first num_values of memrl.data.synthetic.VALUES."""
    fact_position: str = "random"
    """Where a piece's facts sit: "random" word positions, or "start" (the piece begins with them)."""

    def __post_init__(self) -> None:
        if self.num_chunks < 2:
            raise ValueError(f"LookbackConfig.num_chunks must be >= 2, got {self.num_chunks}")
        if self.facts_per_chunk < 1 or 4 * self.facts_per_chunk > self.chunk_words:
            raise ValueError(
                f"LookbackConfig.facts_per_chunk must be in [1, chunk_words/4], got {self.facts_per_chunk}"
            )
        if not 0.0 <= self.lookback_fraction <= 1.0:
            raise ValueError(
                f"LookbackConfig.lookback_fraction must be in [0, 1], got {self.lookback_fraction}"
            )
        if self.fact_position not in ("random", "start"):
            raise ValueError(
                f"LookbackConfig.fact_position must be random or start, got {self.fact_position!r}"
            )
        if not 2 <= self.num_values <= len(VALUES):
            raise ValueError(
                f"LookbackConfig.num_values must be in [2, {len(VALUES)}], got {self.num_values}"
            )
        if not 8 <= self.num_keys <= len(KEYS):
            raise ValueError(f"LookbackConfig.num_keys must be in [8, {len(KEYS)}], got {self.num_keys}")


def make_lookback_task(cfg: LookbackConfig, seed: int, index: int) -> Task:
    """Task `index` of the look-back stream seeded `seed`.

    meta: answer_chunk / link_chunk (piece indices), gap = link_chunk - answer_chunk (> 0 = look-back).
    """
    rng = random.Random(f"lookback:{seed}:{index}:{cfg.num_chunks}")
    n = cfg.num_chunks
    keys = list(KEYS[: cfg.num_keys])
    qkey, mid = rng.sample(keys, 2)
    values = VALUES[: cfg.num_values]
    answer = rng.choice(values)
    if rng.random() < cfg.lookback_fraction:
        link_chunk = rng.randrange(1, n)
        answer_chunk = rng.randrange(0, link_chunk)
    else:
        answer_chunk = rng.randrange(0, n)
        link_chunk = rng.randrange(0, answer_chunk + 1)
    others = [k for k in keys if k not in (qkey, mid)]
    slots: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    slots[link_chunk].append((qkey, mid))
    slots[answer_chunk].append((mid, answer))
    # Distractor keys are distinct while the key set lasts; a reused one never collides with qkey/mid.
    pool = rng.sample(others, k=len(others))
    j = 0
    for c in range(n):
        while len(slots[c]) < cfg.facts_per_chunk:
            slots[c].append((pool[j % len(pool)], rng.choice(values)))
            j += 1
        rng.shuffle(slots[c])
    pieces = []
    for these in slots:
        n_filler = cfg.chunk_words - 3 * len(these)
        words = [rng.choice(FILLER) for _ in range(n_filler)]
        if cfg.fact_position == "start":
            spots = [0] * len(these)
        else:
            spots = sorted(rng.sample(range(n_filler + 1), k=len(these)))
        for off, (spot, (k, v)) in enumerate(zip(spots, these, strict=True)):
            words[spot + 3 * off : spot + 3 * off] = [k, "is", v]
        pieces.append("".join(" " + w for w in words))
    return Task(
        task_id=f"lookback-s{seed}-c{n}-{index}",
        question=QUESTION_2.format(key=qkey),
        context="".join(pieces),
        answers=[answer],
        meta={
            "num_chunks": n,
            "answer_chunk": answer_chunk,
            "link_chunk": link_chunk,
            "gap": link_chunk - answer_chunk,
            "bridge": mid,
            "seed": seed,
        },
    )


def make_lookback_tasks(cfg: LookbackConfig, n: int, seed: int, start: int = 0) -> list[Task]:
    """Tasks start..start+n-1 of the look-back stream seeded `seed`."""
    return [make_lookback_task(cfg, seed, i) for i in range(start, start + n)]


def corpus_extra(templates: tuple[str, ...] = (), copies: int = 50) -> tuple[str, ...]:
    """Strings to add to the tokenizer corpus (`synthetic.corpus_text(extra=...)`) so ReMemR1's tags,
    placeholders and the given prompt templates become few tokens."""
    k, m, v = KEYS[0], KEYS[1], VALUES[0]
    mem = memory_text([(k, m), (m, v)])
    block = (
        f"<thinking></thinking><update>{mem}</update><recall> {m}</recall>\n"
        f"<problem>what is what {k} is</problem>\n<recalled_memory>No memory was recalled.</recalled_memory>\n"
        f"<memory>No previous memory</memory>\n<section> {k} is {v}</section>\n\\boxed{{ {v}}}\n"
    )
    return tuple([block] * copies + [t for t in templates for _ in range(copies)])


# ----------------------------------------------------------------------------------------------
# Scripted reference policies (prompt text in, reply text out), for ScriptedEngine.
# ----------------------------------------------------------------------------------------------


def _template_regex(template: str, names: tuple[str, ...]) -> re.Pattern[str]:
    pattern = re.escape(template)
    for name in names:
        pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>.*?)", 1)
    return re.compile(pattern + r"(?:<\|im_end\|>|</user>|$)", re.DOTALL)


@dataclass
class LookbackOracle:
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
            raise ValueError(f"LookbackOracle.workflow must be memagent or rememr1, got {self.workflow!r}")
        recalled = ("recalled_memory",) if self.workflow == "rememr1" else ()
        self._mem = _template_regex(self.memory_template, ("problem", *recalled, "memory", "chunk"))
        self._fin = _template_regex(self.final_template, ("problem", *recalled, "memory"))

    @classmethod
    def for_config(cls, workflow: str, cfg: object, **kw: object) -> LookbackOracle:
        """The oracle for a MemAgentConfig / ReMemR1Config (its templates, placeholder and tags)."""
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
            raise ValueError(f"LookbackOracle: prompt matches neither template: {prompt[:200]!r}")
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
