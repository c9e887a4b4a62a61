"""Build RULER's synthetic tasks locally, in RULER's own layout, at lengths measured in a given tokenizer.

    build_ruler(out_dir, tokenizer, tasks=("niah_single_1", "vt"), lengths=(8192,), seed=42, samples=100)
        -> <out>/<len>/data/<task>/validation.jsonl + <out>/manifest.json

Task definitions follow NVIDIA/RULER (scripts/synthetic.yaml and scripts/data/synthetic/{niah,
variable_tracking,freq_words_extraction,qa}.py, constants.py); the generators and the prompt wording are
memrl's own, with RULER's structure: instruction, haystack, the question as the LAST line of `input`
(memrl.data.ruler splits there), and the answer prefix in its own field.

- niah_*: needles "a special magic <number|uuid|word> for <key> is: <value>." in a haystack of noise lines
  (built in: memrl's own noise sentences, one per line), essay words (`haystack` file, needed by
  niah_single_2/3, multikey_1, multivalue, multiquery; needles go in at sentence boundaries at depths drawn
  from 40 evenly spaced ones, 0..100%) or other needles (multikey_2/3). Keys and values: 7-digit numbers,
  uuid4s, or adjective-noun words. multikey_1: 4 keys, multivalue: 4 values, multiquery: 4 keys asked.
- vt: one chain of 4 hops (VAR A = 12345, VAR B = VAR A, ...) in noise lines; answers = the 5 variables.
  A one-shot worked example (3-letter names, a short haystack) precedes the task, as RULER's few-shot does.
- fwe: coded words (6 random lowercase letters) with Zipf counts n*k^-alpha/zeta(alpha) (alpha 2.0), the
  top-ranked word replaced by dots, vocabulary size (target tokens - 50) // 50; answers = ranks 2-4.
- qa_1 / qa_2: a question's own paragraph(s) plus distractors from the source set, shuffled, rendered
  "Document i:\\n<text>"; qa_1 reads SQuAD (v2 layout; impossible questions dropped), qa_2 HotpotQA (either
  layout). Any QA source works for either (`qa_source`).

Length: `length` = tokens of the prompt (input + answer prefix) + the task's tokens to generate (RULER's:
niah 128, vt 30, fwe 50, qa 32), never above the target and, per row, at least 98% of it: the haystack size
is binary-searched for sample 0 and re-searched for any row that falls outside the band. QA at whole
documents (RULER) can fall short by up to one document, so memrl fills with the first words of one more
distractor (`qa_fill="words"`; "docs" = RULER's whole documents, without the 98% guarantee).

Determinism: every row draws from `random.Random("<seed>:<task>:<length>:<row>")`, so a rebuild with the
same seed, tokenizer and inputs is byte-identical, and rows are independent of each other.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import string
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.data.errors import DataError
from memrl.data.files import replacing, write_jsonl
from memrl.data.io import load_tasks

# ------------------------------------------------------------------ task parameters (RULER synthetic.yaml)

NIAH = {
    "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 1, 1, 4),
}
"""task -> (haystack, key type, value type, keys, values per key, keys asked)."""
BUILD_TASKS = (*NIAH, "vt", "fwe", "qa_1", "qa_2")
PAPER_TASKS = (*NIAH, "vt", "fwe", "qa_1")
"""The 11 RULER tasks MemAgent's paper reports."""
TOKENS_TO_GENERATE = {"niah": 128, "vt": 30, "fwe": 50, "qa": 32}
VT_CHAINS, VT_HOPS = 1, 4
FWE_ALPHA, FWE_WORDLEN = 2.0, 6
DEPTHS = [round(100 * i / 39) for i in range(40)]
"""Needle depths (percent) for essay haystacks: 40 evenly spaced from 0 to 100."""
QA_FILL = ("words", "docs")
MAX_SIZE = 1 << 24
"""Haystack units past which a search gives up (a source that cannot reach the length)."""
LOWER = 0.98
"""Each row's length is in [LOWER * target, target]."""

# memrl's own noise lines and key words (not RULER's text)
NOISE = ("Rain fell on the quiet town.", "A dog slept by the door.", "The river ran past the mill.",
         "Bread cooled on the window sill.", "Someone hummed a tune and walked on.")
_ADJ = ("amber ancient brave bright calm clever cold crisp curious damp dark eager early faint fancy fierce "
        "gentle giant glad golden grand green happy hollow humble icy jolly kind large lively lone loud lucky "
        "mellow merry mighty misty modest narrow neat noble odd old pale plain polite proud quick quiet rapid "
        "rare rich rough round royal rusty sandy sharp shiny silent silver simple sleepy slow small smooth "
        "soft solid sour spare steady stiff stormy strange sturdy sunny sweet swift tall tame tender thick "
        "tidy tiny tough vast velvet vivid warm wary wide wild wise witty young zesty").split()
_NOUN = ("anchor apple arrow badge basket beacon bell blanket boat bottle bridge bucket cabin candle canyon "
         "carpet castle cellar chair cliff clock cloud comet copper cottage crown dagger desert diamond dragon "
         "drum eagle engine falcon feather fence fiddle forest fossil garden garnet glacier globe harbor "
         "helmet hollow island jacket jungle kettle ladder lantern lemon magnet marble meadow mirror monkey "
         "needle oasis orchard otter paddle parrot pebble pepper piano pillow pirate planet pocket puzzle "
         "quartz rabbit ribbon rocket saddle sailor shadow shell spider spoon statue tiger tower trumpet "
         "tunnel valley violin wagon walnut whistle window wizard").split()
WORDS = sorted({f"{a}-{n}" for a in _ADJ for n in _NOUN})


# ------------------------------------------------------------------ memrl's prompt wording

def _niah_prompt(vtype: str, plural: bool, context: str, query: str) -> tuple[str, str]:
    if plural:
        head = (f"Some special magic {vtype} are hidden in the text below. Keep them in mind: you will be "
                f"asked about the {vtype} afterwards.")
        q = f"Which special magic {vtype} for {query} does the text above mention?"
        prefix = f" The special magic {vtype} for {query} mentioned in the text above are"
    else:
        one = vtype[:-1]
        head = (f"A special magic {one} is hidden in the text below. Keep it in mind: you will be asked "
                f"about the {one} afterwards.")
        q = f"Which special magic {one} for {query} does the text above mention?"
        prefix = f" The special magic {one} for {query} mentioned in the text above is"
    return f"{head}\n{context}\n{q}", prefix


def _vt_prompt(context: str, value: str, n: int) -> tuple[str, str]:
    return (f"Follow the chain(s) of variable assignments hidden in the text below.\n\n{context}\n"
            f"Question: Which variables are given the value {value} in the text above?",
            f" Answer: Following the chain(s) of assignments in the text above, {n} variables are given "
            f"the value {value}, namely: ")


def _fwe_prompt(context: str) -> tuple[str, str]:
    return ("Read the coded text below and count how often each coded word occurs; find the three coded "
            f"words that occur most often. {context}\nQuestion: Give no explanation and ignore the dots "
            "'....'. Which three words occur most often in the coded text above?",
            " Answer: In the coded text above, the three most frequent words are:")


def _qa_prompt(context: str, question: str) -> tuple[str, str]:
    rule = "Answer the question from the documents. Reply with the answer only, nothing else."
    return (f"{rule}\n\nHere are the documents.\n\n{context}\n\n{rule}\n\nQuestion: {question}", " Answer:")


# ------------------------------------------------------------------ generators (one row, one haystack size)

@dataclass
class Row:
    input: str
    answer_prefix: str
    outputs: list[str]


def _rand(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return rng.choice(WORDS)


def _needle(vtype: str, key: str, value: str) -> str:
    return f"A special magic {vtype[:-1]} for {key} is: {value}."


def _sentences(words: Sequence[str]) -> list[str]:
    """Sentences of a word run: split after '.', '!' or '?' (a plain rule in place of nltk's punkt)."""
    out, cur = [], []
    for w in words:
        cur.append(w)
        if re.search(r"[.!?][\"')\]]*$", w):
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def _essay_words(essay: Sequence[str], n: int) -> list[str]:
    if not essay:
        raise DataError("the essay haystack is empty; pass a --haystack file with text")
    reps = -(-n // len(essay))
    return (list(essay) * reps)[:n]


def _insert_at_depths(sents: list[str], items: Sequence[str], rng: random.Random) -> str:
    cuts = sorted(int(len(sents) * d / 100) for d in rng.sample(DEPTHS, len(items)))
    parts, last = [], 0
    for cut, item in zip(cuts, items, strict=True):
        parts += sents[last:cut] + [item]
        last = cut
    return " ".join(parts + sents[last:])


def niah_row(task: str, size: int, rng: random.Random, essay: Sequence[str], noise: Sequence[str]) -> Row:
    hay, ktype, vtype, nk, nv, nq = NIAH[task]
    nk = max(nk, nq)
    keys: list[str] = []
    values: list[list[str]] = []
    needles = []
    while len(keys) < nk:
        k = _rand(ktype, rng)
        if k in keys:
            continue
        keys.append(k)
        values.append([_rand(vtype, rng) for _ in range(nv)])
        needles += [_needle(vtype, k, v) for v in values[-1]]
    rng.shuffle(needles)
    fixed = random.Random(rng.random())  # haystack draws: separate, so the needles do not depend on size
    if hay == "essay":
        context = _insert_at_depths(_sentences(_essay_words(essay, size)), needles, fixed)
    else:
        if hay == "noise":
            lines = [noise[i % len(noise)] for i in range(size)]
        else:
            lines = []
            for _ in range(size):
                k = _rand(ktype, fixed)
                while k in keys:
                    k = _rand(ktype, fixed)
                lines.append(_needle(vtype, k, _rand(vtype, fixed)))
        for pos, nd in zip(sorted(fixed.sample(range(size + 1), len(needles)), reverse=True), needles,
                           strict=True):
            lines.insert(pos, nd)
        context = "\n".join(lines)
    asked = rng.sample(range(nk), nq)
    queries = [keys[i] for i in asked]
    query = queries[0] if nq == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
    text, prefix = _niah_prompt(vtype, nq * nv > 1, context, query)
    return Row(text, prefix, [v for i in asked for v in values[i]])


def _vt_chain(rng: random.Random, name_len: int, value: str) -> tuple[list[str], list[str]]:
    names: list[str] = []
    while len(names) < VT_HOPS + 1:
        n = "".join(rng.choices(string.ascii_uppercase, k=name_len))
        if n not in names:
            names.append(n)
    lines = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(VT_HOPS)]
    return names, lines


def _vt_context(lines: list[str], size: int, rng: random.Random, noise: Sequence[str]) -> str:
    hay = [noise[i % len(noise)] for i in range(size)]
    for off, (pos, line) in enumerate(zip(sorted(rng.sample(range(size + 1), len(lines))), lines, strict=True)):
        hay.insert(pos + off, line)
    return "\n".join(hay)


def vt_row(size: int, rng: random.Random, noise: Sequence[str]) -> Row:
    value = str(rng.randint(10000, 99999))
    names, chain = _vt_chain(rng, 5, value)
    ex_value = str(rng.randint(10000, 99999))
    ex_names, ex_chain = _vt_chain(rng, 3, ex_value)
    ex_seed, fixed = rng.random(), random.Random(rng.random())
    ex_text, ex_prefix = _vt_prompt(_vt_context(ex_chain, 5, random.Random(ex_seed), noise), ex_value, VT_HOPS + 1)
    text, prefix = _vt_prompt(_vt_context(chain, size, fixed, noise), value, VT_HOPS + 1)
    example = f"{ex_text}\n{ex_prefix}{' '.join(ex_names)}"
    return Row(f"{example}\n\n{text}", prefix, names)


def zeta(alpha: float) -> float:
    """Riemann zeta(alpha), alpha > 1: a partial sum plus its Euler-Maclaurin tail."""
    n = 1000
    return (sum(k**-alpha for k in range(1, n)) + n ** (1 - alpha) / (alpha - 1) + 0.5 * n**-alpha
            + alpha * n ** (-alpha - 1) / 12)


def fwe_row(size: int, rng: random.Random, vocab_size: int) -> Row:
    vocab: set[str] = set()
    while len(vocab) < vocab_size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=FWE_WORDLEN)))
    words = sorted(vocab)
    rng.shuffle(words)
    words[0] = "..."  # the most frequent "word" is noise
    z = zeta(FWE_ALPHA)
    bag = [w for k, w in enumerate(words, start=1) for _ in range(int(size * k**-FWE_ALPHA / z))]
    random.Random(rng.random()).shuffle(bag)
    text, prefix = _fwe_prompt(" ".join(bag))
    return Row(text, prefix, words[1:4])


@dataclass
class QAItem:
    question: str
    answers: list[str]
    docs: list[int]
    """Indices of the question's own paragraphs in the document list."""
    near: list[int]
    """Other paragraphs of the same article (SQuAD), used first as distractors."""


def read_qa_source(path: str | os.PathLike[str]) -> tuple[list[QAItem], list[str]]:
    """(questions, sorted distinct documents) of a SQuAD file or any HotpotQA / 2Wiki file memrl reads."""
    if not Path(path).exists():
        raise DataError(f"--qa-source {path} does not exist")
    if str(path).endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = None  # JSON lines or not JSON: load_tasks names the problem
        if isinstance(data, dict) and "data" in data:
            return _read_squad(path, data)
    tasks = load_tasks(path)
    docs_of = []
    for t in tasks:
        paras = t.meta.get("paragraphs")
        if not isinstance(paras, list):
            raise DataError(f"{path}: --qa-source must be SQuAD JSON or a HotpotQA / 2Wiki file; "
                            f"task {t.task_id} has no paragraphs")
        docs_of.append([f"{p['title']}\n{''.join(p['sentences'])}" for p in paras])
    docs = sorted({d for ds in docs_of for d in ds})
    idx = {d: i for i, d in enumerate(docs)}
    items = [QAItem(t.question, list(t.answers), [idx[d] for d in ds], []) for t, ds in zip(tasks, docs_of, strict=True)]
    return items, docs


def _read_squad(path: Any, data: dict[str, Any]) -> tuple[list[QAItem], list[str]]:
    try:
        docs = sorted({p["context"] for art in data["data"] for p in art["paragraphs"]})
        idx = {d: i for i, d in enumerate(docs)}
        items = []
        for art in data["data"]:
            same = [idx[p["context"]] for p in art["paragraphs"]]
            for p in art["paragraphs"]:
                me = idx[p["context"]]
                for qa in p["qas"]:
                    if qa.get("is_impossible") or not qa["answers"]:
                        continue
                    items.append(QAItem(qa["question"], [a["text"] for a in qa["answers"]], [me],
                                        [j for j in same if j != me]))
    except (KeyError, TypeError) as e:
        raise DataError(f"{path}: not a SQuAD file (data[].paragraphs[].context / qas[]): missing {e}") from e
    return items, docs


def qa_row(item: QAItem, docs: list[str], size: int, extra_words: int, rng: random.Random) -> Row:
    """`size` whole documents (own first, then same-article ones, then others), plus the first
    `extra_words` words of one more distractor; shuffled."""
    order_rng = random.Random(rng.random())
    own = list(item.docs)
    near = [j for j in item.near if j not in own]
    order_rng.shuffle(near)
    pool_needed = size + 1 - len(own) - len(near)
    taken = set(own) | set(near)
    others: list[int] = []
    if pool_needed > 0:
        cand = order_rng.sample(range(len(docs)), min(len(docs), pool_needed + len(taken)))
        others = [j for j in cand if j not in taken][:pool_needed]
    distinct = own + near + others
    if size + 1 > len(distinct):  # the source has too few documents: repeat them, as RULER's qa.py does
        distinct = (distinct * -(-(size + 1) // len(distinct)))[: size + 1]
    chosen = distinct[: max(size, len(own))]
    texts = [docs[j] for j in chosen]
    spare = distinct[len(chosen):]
    if extra_words and spare:
        texts.append(" ".join(docs[spare[0]].split(" ")[:extra_words]))
    random.Random(rng.random()).shuffle(texts)
    context = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(texts))
    text, prefix = _qa_prompt(context, item.question)
    return Row(text, prefix, list(item.answers))


# ------------------------------------------------------------------ fitting a length

def _largest_fitting(make: Callable[[int], int], target: int, guess: int, lo: int = 0) -> int:
    """The largest size >= lo with make(size) <= target (make grows with size), searched from `guess`
    outwards then bisected; lo when even lo is too long."""
    guess = max(guess, lo)
    if make(guess) <= target:
        good, step = guess, max(1, guess // 8)
        while make(good + step) <= target:
            good, step = good + step, step * 2
            if good > MAX_SIZE:
                raise DataError(f"the text stops growing with its haystack size (still <= {target} tokens at "
                                f"{good} units); is the haystack / QA source empty?")
        bad = good + step
    else:
        bad, step = guess, max(1, (guess - lo) // 8)
        while True:
            probe = max(lo, bad - step)
            if make(probe) <= target:
                good = probe
                break
            if probe == lo:
                return lo
            bad, step = probe, step * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        if make(mid) <= target:
            good = mid
        else:
            bad = mid
    # random placement makes the length only nearly monotone in the size: look a few sizes further
    for more in range(good + 1, good + 4):
        if make(more) <= target:
            good = more
    return good


def read_text_file(path: str, flag: str) -> str:
    """A UTF-8 text file named by option `flag`; DataError naming the file, line and byte that is not UTF-8, or
    a lone surrogate, instead of a decoder traceback."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{flag} {path}: line {line}: a byte that is not UTF-8 (0x{data[e.start]:02x}) at byte "
                        f"{e.start}; expected UTF-8 text") from None
    return text


MAX_LENGTH = 1 << 25
"""Longest target length (32m tokens): a row's haystack is built and tokenized in memory."""


def parse_length(text: str) -> int:
    """'8k' -> 8192, '1m' -> 1048576, '5000' -> 5000."""
    t = text.strip().lower()
    mult = {"k": 1 << 10, "m": 1 << 20}.get(t[-1:], 1)
    num = t[:-1] if mult > 1 else t
    if not num.isdigit() or int(num) < 1:
        raise ValueError(f"a length is a positive integer with an optional k or m suffix (8k = 8192), got {text!r}")
    if int(num) * mult > MAX_LENGTH:
        raise ValueError(f"{text!r} is more than {MAX_LENGTH // (1 << 20)}m tokens: each row's context is built "
                         "and tokenized in memory")
    return int(num) * mult


@dataclass
class BuildOptions:
    seed: int = 42
    samples: int = 100
    """Rows per (task, length); RULER's default num_samples is 500."""
    haystack: str = ""
    """Essay text file for the essay haystacks (RULER uses Paul Graham's essays)."""
    noise: str = ""
    """Noise file, one sentence per line ("" = memrl's built-in noise lines)."""
    qa_source: str = ""
    """SQuAD / HotpotQA file the qa tasks draw from."""
    qa_fill: str = "words"
    """words = fill the last gap with the first words of one more distractor (memrl); docs = whole
    documents only (RULER)."""


class Builder:
    """Rows of one task at one length, with the tokenizer that measures them."""

    def __init__(self, tokenizer: Any, opts: BuildOptions) -> None:
        self.tok = tokenizer
        self.opts = opts
        self.essay: list[str] = []
        self.noise: tuple[str, ...] = NOISE
        self._qa: tuple[list[QAItem], list[str]] | None = None
        if opts.haystack:
            text = read_text_file(opts.haystack, "--haystack")
            self.essay = text.split()  # words; a blank file has none (was [""]: rows of needles and spaces)
            if not self.essay:
                raise DataError(f"--haystack {opts.haystack}: no words of text; the essay haystack needs some")
        if opts.noise:
            lines = [ln.strip() for ln in read_text_file(opts.noise, "--noise").splitlines() if ln.strip()]
            if not lines:
                raise DataError(f"--noise {opts.noise}: no lines of text")
            self.noise = tuple(lines)

    def tokens(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False))

    def qa(self) -> tuple[list[QAItem], list[str]]:
        if self._qa is None:
            self._qa = read_qa_source(self.opts.qa_source)
            if not self._qa[0]:
                raise DataError(f"--qa-source {self.opts.qa_source}: no answerable questions")
        return self._qa

    def family(self, task: str) -> str:
        return "niah" if task in NIAH else "qa" if task.startswith("qa_") else task

    def make(self, task: str, length: int, row: int, size: int, extra: int = 0) -> Row:
        rng = random.Random(f"{self.opts.seed}:{task}:{length}:{row}")
        if task in NIAH:
            return niah_row(task, size, rng, self.essay, self.noise)
        if task == "vt":
            return vt_row(size, rng, self.noise)
        if task == "fwe":
            return fwe_row(size, rng, max(4, (length - TOKENS_TO_GENERATE["fwe"]) // 50))
        items, docs = self.qa()
        return qa_row(items[row % len(items)], docs, size, extra, rng)

    def length_of(self, task: str, r: Row) -> int:
        return self.tokens(r.input + r.answer_prefix) + TOKENS_TO_GENERATE[self.family(task)]

    def fit_row(self, task: str, length: int, row: int, guess: int) -> tuple[Row, int, int]:
        """(row, its length, the size used): the largest haystack with length <= target."""
        lo = 1 if task != "fwe" else 0
        size = _largest_fitting(lambda s: self.length_of(task, self.make(task, length, row, s)), length, guess, lo)
        extra = 0
        if task.startswith("qa_") and self.opts.qa_fill == "words":
            extra = _largest_fitting(
                lambda w: self.length_of(task, self.make(task, length, row, size, w)), length, 0, 0)
        r = self.make(task, length, row, size, extra)
        return r, self.length_of(task, r), size

    def build(self, task: str, length: int) -> tuple[list[dict[str, Any]], int]:
        """RULER rows of `task` at `length` and the haystack size found for row 0."""
        if task in NIAH and NIAH[task][0] == "essay" and not self.essay:
            raise DataError(f"task {task} needs an essay haystack: pass --haystack FILE (any long English text)")
        if task.startswith("qa_") and not self.opts.qa_source:
            raise DataError(f"task {task} needs --qa-source FILE (SQuAD JSON for qa_1, HotpotQA for qa_2)")
        probe = self.length_of(task, self.make(task, length, 0, 16)) - self.length_of(task, self.make(task, length, 0, 8))
        guess = max(1, int(8 * length / max(1, probe)))  # sizes per token from two small probes
        r0, _, size0 = self.fit_row(task, length, 0, guess)
        rows = []
        for i in range(self.opts.samples):
            r, n = (r0, self.length_of(task, r0)) if i == 0 else (None, 0)
            if r is None:
                r = self.make(task, length, i, size0)
                n = self.length_of(task, r)
                if task.startswith("qa_") or not (LOWER * length <= n <= length):
                    r, n, _ = self.fit_row(task, length, i, size0)
            if self.opts.qa_fill == "words" or not task.startswith("qa_"):
                if not LOWER * length <= n <= length:
                    raise DataError(f"{task} at {length} tokens, row {i}: the closest haystack gives {n} tokens, "
                                    f"outside [{math.ceil(LOWER * length)}, {length}] (the length is too small "
                                    "for this task's fixed text, or the haystack unit too coarse)")
            rec: dict[str, Any] = {"index": i, "input": r.input, "outputs": r.outputs, "length": n,
                                   "length_w_model_temp": n, "answer_prefix": r.answer_prefix}
            if task in NIAH:  # RULER's niah rows: character position of the first answer, and its token position
                pos = r.input.find(r.outputs[0])
                rec["index"] = pos
                rec["token_position_answer"] = self.tokens(r.input[:pos])
            rows.append(rec)
        return rows, size0


def build_ruler(out_dir: str | os.PathLike[str], tokenizer: Any, tasks: Sequence[str], lengths: Sequence[int],
                opts: BuildOptions, tokenizer_name: str = "",
                on_file: Callable[[str, int, str, int], None] | None = None) -> dict[str, Any]:
    """Write `<out>/<length>/data/<task>/validation.jsonl` for every task and length, plus manifest.json."""
    bad = [t for t in tasks if t not in BUILD_TASKS]
    if bad:
        raise DataError(f"unknown RULER task(s) {', '.join(bad)}; memrl builds {', '.join(BUILD_TASKS)}")
    if opts.qa_fill not in QA_FILL:
        raise DataError(f"qa_fill must be one of {', '.join(QA_FILL)}, got {opts.qa_fill!r}")
    b = Builder(tokenizer, opts)
    out = Path(out_dir)
    man: dict[str, Any] = {"generator": "memrl.data.ruler_build", "seed": opts.seed, "samples": opts.samples,
                           "tokenizer": tokenizer_name, "haystack": Path(opts.haystack).name if opts.haystack else "",
                           "noise": Path(opts.noise).name if opts.noise else "built-in",
                           "qa_source": Path(opts.qa_source).name if opts.qa_source else "", "qa_fill": opts.qa_fill,
                           "files": {}}
    for length in lengths:
        for task in tasks:
            rows, size = b.build(task, int(length))
            path = out / str(length) / "data" / task / "validation.jsonl"
            write_jsonl(path, rows)  # through a temporary file: a full disk leaves no partial file
            man["files"][f"{length}/{task}"] = {"path": str(path.relative_to(out)), "rows": len(rows),
                                               "haystack_size": size,
                                               "min_length": min(r["length"] for r in rows),
                                               "max_length": max(r["length"] for r in rows)}
            if on_file is not None:
                on_file(task, int(length), str(path), len(rows))
    with replacing(out / "manifest.json") as tmp:
        tmp.write_text(json.dumps(man, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return man
