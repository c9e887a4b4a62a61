"""Top-1 retrieval over a trajectory's own past memories (ReMemR1 callbacks, arXiv 2509.23040).

Three scorers, pure python (no sklearn):
- "tfidf": cosine of TF-IDF vectors, refit on the candidate memories at every call, as the released
  code does (sklearn `TfidfVectorizer` defaults: raw term counts, smooth idf
  idf(w) = ln((1 + N) / (1 + df(w))) + 1, L2-normalized rows; query words outside the memories'
  vocabulary are ignored).
- "word_overlap": the paper's word-overlap recall, |words(q) & words(m)| / |words(q)| over unique words.
- "bm25": Okapi BM25 with the Lucene idf ln(1 + (N - df + 0.5) / (df + 0.5)) (always positive),
  score(q, m) = sum over unique query words w of idf(w) * tf(w,m)*(k1+1) / (tf(w,m) + k1*(1 - b + b*|m|/avgdl)).

Words are lowercase `\\w+` runs. The released code tokenizes with the policy's subword tokenizer for
TF-IDF; words keep retrieval independent of the model. Identical memory texts are one candidate (the
released code keeps memories in a set), credited to the latest step that wrote them. Ties go to the most
recent memory. A best score <= `min_score` (default 0: nothing in common) retrieves nothing.

`rule="released"` scores as the released code does (syr-cn/ReMemR1 recurrent/impls/tf_idf_retriever.py and
taskutils/memory_eval/utils/tf_idf_retriever.py, `TfidfRetriever`): TF-IDF terms are the policy
tokenizer's pieces of the lowercased text with every "Ġ" removed (`subword_terms`); every memory is a
candidate, the empty one included (it scores 0); no candidate with a term (sklearn's "empty vocabulary"
error) retrieves nothing. Ties: the released code keeps the memories in a Python `set` and takes the last
index of `np.argsort(sims)` (ascending, numpy's default sort, not stable), taken over the set's
iteration order; which of several equal scores that is depends on that order, which follows the strings'
hashes and changes with every process (PYTHONHASHSEED), and on how numpy's sort orders equal keys. No
fixed order reproduces it. memrl's reproducible stand-in: candidates in the order of the SHA-256 digests
of their texts, the last tied one wins: like the set, it ignores which step wrote a memory.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Scorer = Literal["tfidf", "word_overlap", "bm25"]
SCORERS: tuple[str, ...] = ("tfidf", "word_overlap", "bm25")
RECALL_RULES: tuple[str, ...] = ("memrl", "released")

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """Lowercase `\\w+` runs of `text`, in order, with repeats."""
    return _WORD.findall((text or "").lower())


def subword_terms(tokenizer: Any) -> Callable[[str], list[str]]:
    """The released TF-IDF's terms of a text: `tokenizer.tokenize(text.lower())` with every "Ġ" (the
    byte-level BPE space mark) removed from each piece; other marks (e.g. "Ċ" for a newline) stay. A
    tokenizer without `tokenize` (memrl's test doubles): each token id decoded alone, spaces removed, empty
    pieces dropped."""
    if hasattr(tokenizer, "tokenize"):
        def terms(text: str) -> list[str]:
            return [t.replace("\u0120", "") for t in tokenizer.tokenize((text or "").lower())]
    else:
        def terms(text: str) -> list[str]:
            ids = tokenizer.encode((text or "").lower(), add_special_tokens=False)
            return [p for p in (tokenizer.decode([i]).replace(" ", "") for i in ids) if p]
    return terms


def tfidf_scores(query: str, docs: Sequence[str], tokenize: Callable[[str], list[str]] = words) -> list[float]:
    """Cosine(tfidf(query), tfidf(doc)) for each doc, with idf fitted on `docs` only (sklearn defaults);
    terms = `tokenize(text)` (default: lowercase words)."""
    toks = [Counter(tokenize(d)) for d in docs]
    n = len(docs)
    df: Counter[str] = Counter()
    for c in toks:
        df.update(c.keys())
    idf = {w: math.log((1 + n) / (1 + k)) + 1.0 for w, k in df.items()}

    def unit(counts: Counter[str]) -> dict[str, float]:
        vec = {w: c * idf[w] for w, c in counts.items() if w in idf}
        norm = math.sqrt(sum(v * v for v in vec.values()))
        return {w: v / norm for w, v in vec.items()} if norm > 0 else {}

    q = unit(Counter(tokenize(query)))
    out = []
    for c in toks:
        d = unit(c)
        out.append(sum(v * d.get(w, 0.0) for w, v in q.items()))
    return out


def word_overlap_scores(query: str, docs: Sequence[str]) -> list[float]:
    """|unique query words found in doc| / |unique query words| (0 for a query without words)."""
    q = set(words(query))
    if not q:
        return [0.0] * len(docs)
    return [len(q & set(words(d))) / len(q) for d in docs]


def bm25_scores(query: str, docs: Sequence[str], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """Okapi BM25 of each doc for the unique query words (Lucene idf, see the module docstring)."""
    if k1 < 0 or not 0.0 <= b <= 1.0:
        raise ValueError(f"bm25_scores: need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
    toks = [Counter(words(d)) for d in docs]
    lens = [sum(c.values()) for c in toks]
    n = len(docs)
    avgdl = sum(lens) / n if n else 0.0
    df: Counter[str] = Counter()
    for c in toks:
        df.update(c.keys())
    out = []
    for c, dl in zip(toks, lens, strict=True):
        s = 0.0
        for w in set(words(query)):
            tf = c.get(w, 0)
            if not tf:
                continue
            idf = math.log(1.0 + (n - df[w] + 0.5) / (df[w] + 0.5))
            norm = k1 * (1.0 - b + b * dl / avgdl) if avgdl > 0 else k1
            s += idf * tf * (k1 + 1.0) / (tf + norm)
        out.append(s)
    return out


def score(query: str, docs: Sequence[str], scorer: str, k1: float = 1.5, b: float = 0.75,
          tokenize: Callable[[str], list[str]] | None = None) -> list[float]:
    """Scores of `docs` for `query` under the named scorer (`tokenize`: tfidf's terms, default words)."""
    if scorer == "tfidf":
        return tfidf_scores(query, docs, tokenize or words)
    if scorer == "word_overlap":
        return word_overlap_scores(query, docs)
    if scorer == "bm25":
        return bm25_scores(query, docs, k1, b)
    raise ValueError(f"unknown recall scorer {scorer!r}; expected one of {', '.join(SCORERS)}")


@dataclass(frozen=True)
class Recalled:
    """The memory a recall query retrieved: its text, the step that wrote it, and its score."""

    text: str
    step: int
    score: float


def recall_top1(
    query: str,
    memories: Sequence[tuple[int, str]],
    scorer: str = "tfidf",
    min_score: float = 0.0,
    k1: float = 1.5,
    b: float = 0.75,
    rule: str = "memrl",
    tokenize: Callable[[str], list[str]] | None = None,
) -> Recalled | None:
    """The best of `memories` ((step, text) pairs, oldest first) for `query`, or None.

    The caller decides which memories are candidates; ReMemR1 passes only those of earlier steps.
    rule="released": the released code's candidates and tie order (module docstring), tfidf terms from
    `tokenize` (`subword_terms` of the policy's tokenizer).
    """
    if rule == "released":
        return _released_top1(query, memories, scorer, min_score, k1, b, tokenize or words)
    if rule != "memrl":
        raise ValueError(f"recall rule must be one of {', '.join(RECALL_RULES)}, got {rule!r}")
    if not query or not query.strip():
        return None
    latest: dict[str, int] = {}
    for step, text in memories:
        if text and text.strip():
            latest[text] = step  # identical texts are one candidate, credited to the latest step
    if not latest:
        return None
    cands = sorted(latest.items(), key=lambda kv: kv[1])
    scores = score(query, [t for t, _ in cands], scorer, k1, b)
    best = max(range(len(cands)), key=lambda i: (scores[i], cands[i][1]))  # ties -> most recent
    if not scores[best] > min_score:
        return None
    text, step = cands[best]
    return Recalled(text, step, float(scores[best]))


def _released_top1(query: str, memories: Sequence[tuple[int, str]], scorer: str, min_score: float, k1: float,
                   b: float, tokenize: Callable[[str], list[str]]) -> Recalled | None:
    if not query:
        return None
    latest: dict[str, int] = {}
    for step, text in memories:
        latest[text or ""] = step  # every memory, the empty one included; one candidate per text
    if not latest:
        return None
    cands = sorted(latest.items(), key=lambda kv: hashlib.sha256(kv[0].encode("utf-8")).hexdigest())
    texts = [t for t, _ in cands]
    if scorer == "tfidf" and not any(tokenize(t) for t in texts):
        return None  # sklearn's fit raises "empty vocabulary"; the released code then recalls nothing
    scores = score(query, texts, scorer, k1, b, tokenize)
    top = max(scores)
    best = max(i for i, s in enumerate(scores) if s == top)  # the last tied one, as argsort's last
    if not scores[best] > min_score:
        return None
    text, step = cands[best]
    return Recalled(text, step, float(scores[best]))
