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

`memrl.demonstrators.LookbackDemonstrator` is a scripted policy (for `ScriptedEngine`) that keeps the facts known
to matter plus the current piece's facts (about the best an overwriting memory of that size can do),
and its ReMemR1 form that recalls a bridge key it has not kept. It makes SFT traces and references.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from memrl.config import MAX_COUNT, check_config, valid
from memrl.data.synthetic import FILLER, KEYS, QUESTION_2, VALUES, memory_text
from memrl.types import Task


@dataclass
class LookbackConfig:
    """Shape of the look-back tasks; length is `num_chunks` pieces of `chunk_words` tokens."""

    num_chunks: int = valid(4, ge=2, le=MAX_COUNT)
    """Pieces per document (>= 2: the answer fact and the link need different pieces)."""
    chunk_words: int = valid(24, ge=1, le=MAX_COUNT)
    """Words (= tokens of the demo tokenizer) per piece; set the workflow's chunk_tokens to this."""
    facts_per_chunk: int = valid(1, ge=1, le=MAX_COUNT)
    """Facts per piece; the answer fact and the link take one slot each, distractors fill the rest."""
    lookback_fraction: float = valid(1.0, ge=0, le=1)
    """Fraction of tasks whose answer fact comes before the link (the rest: at or after it)."""
    num_keys: int = valid(256, ge=8, le=len(KEYS))
    """Keys drawn from the first num_keys of memrl.data.synthetic.KEYS."""
    num_values: int = valid(len(VALUES), ge=2, le=len(VALUES))
    """Answer values drawn from the first num_values of memrl.data.synthetic.VALUES."""
    fact_position: str = valid("random", choices=("random", "start"))
    """Where a piece's facts sit: "random" word positions, or "start" (the piece begins with them)."""

    def __post_init__(self) -> None:
        check_config(self, "LookbackConfig")  # the declared ranges (valid), also when built in code
        if self.chunk_words >= 1 and self.facts_per_chunk >= 1 and 4 * self.facts_per_chunk > self.chunk_words:
            raise ValueError(
                f"LookbackConfig.facts_per_chunk must be in [1, chunk_words/4], got {self.facts_per_chunk}"
            )
        if self.fact_position not in ("random", "start"):
            raise ValueError(
                f"LookbackConfig.fact_position must be random or start, got {self.fact_position!r}"
            )


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
