"""Synthetic long-context QA that a tiny model can learn on CPU: facts planted in filler text.

A document is `num_chunks` pieces of exactly `chunk_words` words. Every piece is filler words with
`facts_per_chunk` facts "<key> is <value>" planted at a random word position. A one-fact question asks
for the value of one planted key ("what is Kalo"); a two-fact "bridge" question asks for the value of
the key that another key points to ("what is what Kalo is", with facts "Kalo is Miran" and
"Miran is red" planted anywhere). Answers are single words, checked by exact match. Distractor facts
use other keys, so only the question tells which fact matters.

Every word (key, value, filler, template word) is a single token of a tokenizer trained on
`corpus_text()`, so a piece of `chunk_words` words is exactly `chunk_words` tokens and MemAgent's
token chunks line up with the pieces (`memrl demo` checks this). Generation is seeded: the same
(config, seed) always gives the same tasks, and different seeds give independent tasks.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from memrl.config import MAX_COUNT, check_config, valid
from memrl.types import Task

_SYL = (
    "ka lo mi ra ten vor al ber gen ston ham ley ton mar cus ric son bel fer gus dor vil mont ro sa "
    "gar lin mor tor wal ker ash nor ox chi go pa tu zen qui dax fen pol ur ith"
).split()

VALUES: tuple[str, ...] = tuple(
    (
        "red blue green black white pink grey gold silver brown orange purple cyan amber ivory olive "
        "cat dog fox owl bee ant cow pig yak elk bat eel rat hen ram emu "
        "oak elm ash fir yew "
        "tin iron zinc lead jade ruby opal onyx "
        "rain snow wind mist hail frost "
        "salt rice corn milk tea wine bread honey"
    ).split()
)
"""Answer words (single tokens); a fact's value is one of these, or a key for a bridge link."""

FILLER: tuple[str, ...] = tuple(
    (
        "the of and to in a that for it as was with be by on not he this are or his from at which "
        "but have an they you were her she there been one all we their has would when if so no will "
        "more can who its than about after other into two some time only could may first then do any "
        "like over also new such these most years where well made did between back through many before "
        "must being three used under world city river year film album band team game party state "
        "school book people war history part country called known born during including several later "
        "since became found played released based located north south east west family company "
        "president member season series town village church university population district region "
        "county island station music record single director written published directed founded served "
        "elected won award national"
    ).split()
)
"""Filler words; none of them is a key, a value, or the word "is"/"what"."""

QUESTION_1 = "what is {key}"
QUESTION_2 = "what is what {key} is"


def make_keys(n: int = 256, seed: int = 12345) -> tuple[str, ...]:
    """`n` distinct capitalized two-syllable names (fixed seed, so every run shares the key set)."""
    rng = random.Random(seed)
    out: list[str] = []
    seen = set(VALUES) | set(FILLER)
    while len(out) < n:
        k = (rng.choice(_SYL) + rng.choice(_SYL)).capitalize()
        if k.lower() not in seen:
            seen.add(k.lower())
            out.append(k)
    return tuple(out)


KEYS: tuple[str, ...] = make_keys()
_KEY_SET = frozenset(KEYS)


MAX_CHUNKS = 1 << 20
MAX_CHUNK_WORDS = 1 << 16
MAX_WORDS = 1 << 26
WHY_BOUND = "a bound: each document is built in memory"
"""Upper bounds of a synthetic document's size, so a mistyped length fails by name instead of exhausting memory."""


@dataclass
class SyntheticConfig:
    """Shape of the synthetic tasks. Length is counted in chunks (pieces of `chunk_words` tokens)."""

    num_chunks: int = valid(4, ge=1, le=MAX_CHUNKS, note=WHY_BOUND)
    """Pieces per document; evaluation scales this (x1, x4, x16)."""
    min_chunks: int = valid(0, ge=0, le="num_chunks", note="0 = fixed num_chunks")
    """When > 0, every task draws its length uniformly from [min_chunks, num_chunks] (mixed-length
    training, so the answer is often several pieces back); 0 = every task has num_chunks pieces."""
    chunk_words: int = valid(24, ge=1, le=MAX_CHUNK_WORDS, note=WHY_BOUND)
    """Words (= tokens) per piece; set the workflow's chunk_tokens to the same number."""
    facts_per_chunk: int = valid(1, ge=1, le=MAX_COUNT)
    """Facts planted in every piece (the question's fact(s) replace some of them)."""
    bridge_fraction: float = valid(0.0, ge=0, le=1)
    """Fraction of two-fact bridge questions (the rest ask for one fact)."""
    num_keys: int = valid(256, ge=4, le=len(KEYS))
    """Keys drawn from the first num_keys of KEYS."""
    num_values: int = valid(len(VALUES), ge=1, le=len(VALUES))
    """Values drawn from the first num_values of VALUES."""
    fact_position: str = valid("random", choices=("random", "start"))
    """Where a piece's facts sit: "random" word positions, or "start" (the piece begins with them)."""
    fact_sep: str | None = "is"
    """Word between a fact's key and value ("Kalo is red"); null writes "Kalo red", so the value is the
    token right after its key (a one-step induction copy, easier for tiny models)."""
    answer_span: float = valid(1.0, gt=0, le=1)
    """Where the question's fact may sit: in the first ceil(answer_span x num_chunks) pieces of its document
    (1.0 = anywhere, uniformly; the default stream is unchanged). Smaller values leave more memory rewrites
    after the fact, a training curriculum for retention; evaluation keeps 1.0. One-fact questions only (a
    bridge question's facts stay anywhere)."""
    question_style: str = valid("what", choices=("what", "cloze"))
    """"what": "what is Kalo" / "what is what Kalo is"; "cloze": the question is the fact with its value
    blanked, "Kalo is ?" / "Kalo is ? is ?" (it reads like the facts it asks about)."""

    @property
    def fact_words(self) -> int:
        return 3 if self.fact_sep else 2

    def __post_init__(self) -> None:
        check_config(self, "SyntheticConfig")  # the declared ranges (valid), also when built in code
        # (a field outside its own range is left to check_config, which names it)
        if self.chunk_words >= 1 and self.facts_per_chunk >= 1 and (self.fact_words + 1) * self.facts_per_chunk > self.chunk_words:
            raise ValueError(
                f"SyntheticConfig.facts_per_chunk must be in [1, chunk_words/{self.fact_words + 1}], "
                f"got {self.facts_per_chunk}"
            )
        if self.bridge_fraction > 0 and self.num_chunks * self.facts_per_chunk < 2:
            raise ValueError("SyntheticConfig: bridge questions need at least 2 fact slots per document")
        if self.num_chunks * self.chunk_words > MAX_WORDS:
            raise ValueError(f"SyntheticConfig: num_chunks x chunk_words = {self.num_chunks * self.chunk_words} words "
                             f"per document is more than {MAX_WORDS}: {WHY_BOUND}")
        if self.question_style not in ("what", "cloze"):
            raise ValueError(f"SyntheticConfig.question_style must be what or cloze, got {self.question_style!r}")
        if self.fact_position not in ("random", "start"):
            raise ValueError(f"SyntheticConfig.fact_position must be random or start, got {self.fact_position!r}")


def fact_text(key: str, value: str, sep: str | None = "is") -> str:
    return f"{key} {sep} {value}" if sep else f"{key} {value}"


def memory_text(facts: list[tuple[str, str]], sep: str | None = "is", topic: str | None = None,
                topic_sep: str | None = ":") -> str:
    """A memory holding `facts`: "- Kalo is red ; Miran is blue". The leading "- " makes every word
    the same token (" Kalo") as in the document, so writing a memory is copying tokens. With `topic`
    (the question's key) the memory first restates what it is looking for: "- Linka : Kalo is red"."""
    head = "- "
    if topic:
        head += f"{topic} {topic_sep} " if topic_sep else f"{topic} "
    return head + " ; ".join(fact_text(k, v, sep) for k, v in facts)


_FACT = re.compile(r"\b([A-Z][a-z]+) is ([A-Za-z]+)\b")
_FACT_NO_SEP = re.compile(r"\b([A-Z][a-z]+) ([A-Za-z]+)\b")


def find_facts(text: str, sep: str | None = "is") -> list[tuple[str, str]]:
    """(key, value) of every fact "<Key> <sep> <value>" in `text`, in order of appearance."""
    if sep is None or sep == "":
        # Without the separator only the key set tells a fact from text ("No previous memory").
        return [(k, v) for k, v in _FACT_NO_SEP.findall(text) if k in _KEY_SET]
    if sep == "is":
        return _FACT.findall(text)
    return re.findall(rf"\b([A-Z][a-z]+) {re.escape(sep)} ([A-Za-z]+)\b", text)


def question_text(key: str, hops: int, style: str = "what", sep: str | None = "is") -> str:
    """The question asking for `key`'s value (hops=1) or for the value of the key it points to (hops=2)."""
    if style == "cloze":
        blank = f" {sep} ?" if sep else " ?"
        return key + blank * hops
    return (QUESTION_2 if hops == 2 else QUESTION_1).format(key=key)


def question_key(question: str) -> tuple[str, int]:
    """(key, hops) of a question made by this module (either style); ValueError for anything else."""
    q = question.strip()
    m = re.fullmatch(r"what is (what )?([A-Z][a-z]+)( is)?", q)
    if m:
        return m.group(2), 2 if m.group(1) else 1
    m = re.fullmatch(r"([A-Z][a-z]+)((?: [a-z]+)? \?)((?: [a-z]+)? \?)?", q)
    if m:
        return m.group(1), 2 if m.group(3) else 1
    raise ValueError(f"not a synthetic question: {question!r}")


def asked_key(problem: str) -> tuple[str, int]:
    """`question_key(problem)`, or ("", 1) for a problem this module did not write (matches no fact): the
    scripted demonstrators (memrl.demonstrators) read the asked key by it."""
    try:
        return question_key(problem)
    except ValueError:
        return "", 1


def make_task(cfg: SyntheticConfig, seed: int, index: int) -> Task:
    """Task `index` of the stream seeded `seed` (independent of every other index)."""
    if cfg.min_chunks:
        rng = random.Random(f"synthetic:{seed}:{index}:{cfg.min_chunks}-{cfg.num_chunks}")
        n_chunks = rng.randint(cfg.min_chunks, cfg.num_chunks)
    else:  # the fixed-length stream, unchanged
        rng = random.Random(f"synthetic:{seed}:{index}:{cfg.num_chunks}")
        n_chunks = cfg.num_chunks
    keys = list(KEYS[: cfg.num_keys])
    slots = n_chunks * cfg.facts_per_chunk
    bridge = rng.random() < cfg.bridge_fraction
    used = rng.sample(keys, k=min(len(keys), slots + 1))
    qkey = used[0]
    values = VALUES[: cfg.num_values]
    answer = rng.choice(values)
    if bridge:
        mid = used[1]
        planted = [(qkey, mid), (mid, answer)]
        distract_keys = used[2:]
        question = question_text(qkey, 2, cfg.question_style, cfg.fact_sep)
    else:
        planted = [(qkey, answer)]
        distract_keys = used[1:]
        question = question_text(qkey, 1, cfg.question_style, cfg.fact_sep)
    facts: list[tuple[str, str]] = list(planted)
    i = 0
    while len(facts) < slots:
        # Distractor keys repeat only when the key set is smaller than the slots (very long documents).
        facts.append((distract_keys[i % len(distract_keys)] if distract_keys else rng.choice(keys[1:]),
                      rng.choice(values)))
        i += 1
    order = list(range(slots))
    rng.shuffle(order)
    placed = [facts[j] for j in order]
    if cfg.answer_span < 1.0 and not bridge:  # move the fact to a uniform slot of the span (extra draw only here)
        span = math.ceil(cfg.answer_span * n_chunks) * cfg.facts_per_chunk
        at, to = placed.index(planted[0]), rng.randrange(span)
        placed[at], placed[to] = placed[to], placed[at]
    # A repeated distractor key must never be the question's key or carry its answer chain.
    pieces: list[str] = []
    positions: dict[str, int] = {}
    for c in range(n_chunks):
        these = placed[c * cfg.facts_per_chunk : (c + 1) * cfg.facts_per_chunk]
        fw = cfg.fact_words
        n_filler = cfg.chunk_words - fw * len(these)
        words = [rng.choice(FILLER) for _ in range(n_filler)]
        # Insert facts at distinct filler positions, left to right.
        if cfg.fact_position == "start":
            spots = [0] * len(these)
        else:
            spots = sorted(rng.sample(range(n_filler + 1), k=len(these)))
        for off, (spot, (k, v)) in enumerate(zip(spots, these, strict=True)):
            words[spot + fw * off : spot + fw * off] = [k, cfg.fact_sep, v] if cfg.fact_sep else [k, v]
            if (k, v) in planted:
                positions[fact_text(k, v, cfg.fact_sep)] = c
        pieces.append("".join(" " + w for w in words))
    return Task(
        task_id=f"syn-s{seed}-c{n_chunks}-{index}" if not cfg.min_chunks
        else f"syn-s{seed}-c{cfg.min_chunks}to{cfg.num_chunks}-{index}",
        question=question,
        context="".join(pieces),
        answers=[answer],
        meta={"hops": 2 if bridge else 1, "num_chunks": n_chunks, "fact_chunks": positions, "seed": seed},
    )


def make_tasks(cfg: SyntheticConfig, n: int, seed: int, start: int = 0) -> list[Task]:
    """Tasks start..start+n-1 of the stream seeded `seed`."""
    return [make_task(cfg, seed, i) for i in range(start, start + n)]


def at_length(cfg: SyntheticConfig, num_chunks: int) -> SyntheticConfig:
    """The task shape an evaluation at `num_chunks` uses: `cfg`'s pieces and facts, every document exactly
    that long, the asked fact anywhere (training-only curricula such as `answer_span` off)."""
    return replace(cfg, num_chunks=num_chunks, min_chunks=0, answer_span=1.0)


def tasks_by_length(cfg: SyntheticConfig, lengths: list[int], n: int, seed: int) -> dict[int, list[Task]]:
    """{length: `n` tasks of `at_length(cfg, length)` seeded `seed`} (held-out tasks: the same for every
    evaluated policy when the seed is one training never uses)."""
    return {k: make_tasks(at_length(cfg, k), n, seed=seed) for k in lengths}


def task_stream(cfg: SyntheticConfig, seed: int, start: int = 0) -> Iterator[Task]:
    """An endless, resumable stream of tasks: position `start` continues where a run stopped."""
    i = start
    while True:
        yield make_task(cfg, seed, i)
        i += 1


def corpus_text(num_docs: int = 400, seed: int = 0, extra: tuple[str, ...] = ()) -> str:
    """Text to train the tokenizer on: documents, questions, memories and boxed answers of this task.

    Every key, value and filler word appears many times (with a leading space and at line starts), so
    byte-level BPE learns each as one token.
    """
    rng = random.Random(f"corpus:{seed}")
    cfg = SyntheticConfig(num_chunks=4, chunk_words=24, bridge_fraction=0.5)
    parts: list[str] = list(extra)
    for i in range(num_docs):
        t = make_task(cfg, seed, i)
        parts.append(t.context)
        parts.append(t.question)
        k, v = rng.choice(KEYS), rng.choice(VALUES)
        parts.append(f"{memory_text([(k, v)])}\n\\boxed{{ {v}}}\nNo previous memory")
    # Every word at least a few times, both with and without a leading space.
    for _ in range(20):
        parts.append(" ".join(KEYS) + "\n" + "\n".join(KEYS))
        parts.append(" ".join(VALUES) + "\n" + "\n".join(VALUES))
        parts.append(" ".join(FILLER) + "\n" + "\n".join(FILLER))
        parts.append("\n".join(f"\\boxed{{ {v}}}" for v in VALUES))
    return "\n".join(parts)
