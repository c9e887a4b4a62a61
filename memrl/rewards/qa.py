"""QA answer extraction and metrics: boxed answers, normalization, EM, sub-EM, F1.

Normalization and F1 follow the SQuAD / HotpotQA official evaluation scripts (lowercase, drop
punctuation, drop the articles a/an/the, collapse whitespace; F1 special-cases yes/no/noanswer).
Two deliberate extensions, both no-ops on ASCII text: text is NFC-normalized first (so a composed and
a decomposed "é" compare equal), and Unicode punctuation (category P*, e.g. curly quotes, en dash) is
dropped along with ASCII punctuation. An empty (normalized) prediction never matches under EM or sub-EM.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

BOX_OPEN = re.compile(r"\\boxed\s*\{")
"""A box's opening, `\\boxed{` (spaces allowed before the brace)."""
_BRACES = re.compile(r"\\[{}]|[{}]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
_SPECIAL_F1 = ("yes", "no", "noanswer")


def _box_contents(text: str) -> list[str | None]:
    """Contents of every `\\boxed{...}` in order; None for a box whose brace never closes.

    One pass over the braces with a stack (linear time, also on many unclosed boxes); an escaped brace
    `\\{` / `\\}` is literal text, not nesting.
    """
    boxes = {m.end(): k for k, m in enumerate(BOX_OPEN.finditer(text))}  # content start -> box index
    out: list[str | None] = [None] * len(boxes)
    stack: list[int] = []  # content start of every open brace
    for m in _BRACES.finditer(text):
        tok = m.group()
        if tok == "{":
            stack.append(m.end())
        elif tok == "}" and stack:
            start = stack.pop()
            k = boxes.get(start)
            if k is not None:
                out[k] = text[start : m.start()].strip()
    return out


def extract_boxed(text: str) -> str | None:
    """Content of the LAST `\\boxed{...}` (nested braces kept, `\\boxed {x}` accepted), stripped.

    None when there is no box or the last box is never closed (a truncated answer is not an answer).
    """
    boxes = _box_contents(text or "")
    return boxes[-1] if boxes else None


def count_boxed(text: str) -> tuple[int, int]:
    """(number of `\\boxed{` openings, number of those that close with non-empty content)."""
    boxes = _box_contents(text or "")
    return len(boxes), sum(1 for b in boxes if b)


def _drop_punctuation(text: str) -> str:
    return "".join(
        ch for ch in text if ch not in _ASCII_PUNCT and not unicodedata.category(ch).startswith("P")
    )


def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA normalization: lower, drop punctuation, drop articles, collapse whitespace."""
    text = unicodedata.normalize("NFC", text or "").lower()
    text = _drop_punctuation(text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when normalize(prediction) == normalize(gold) and the prediction is not empty."""
    p = normalize_answer(prediction)
    return float(bool(p) and p == normalize_answer(gold))


def sub_exact_match(prediction: str, gold: str) -> float:
    """1.0 when one normalized string contains the other (character substring); empty never matches."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if not p or not g:
        return 0.0
    return float(g in p or p in g)


def f1_score(prediction: str, gold: str) -> float:
    """HotpotQA token F1: 2PR/(P+R) over normalized tokens; 0 if either side is yes/no/noanswer and they differ."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in _SPECIAL_F1 or g in _SPECIAL_F1) and p != g:
        return 0.0
    p_tokens, g_tokens = p.split(), g.split()
    same = sum((Counter(p_tokens) & Counter(g_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_tokens), same / len(g_tokens)
    return 2 * precision * recall / (precision + recall)


def _golds(golds: str | list[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    golds = list(golds)
    if not golds:
        raise ValueError("no gold answers given: expected a non-empty list of strings")
    return golds


def best_em(prediction: str, golds: str | list[str]) -> float:
    """max over gold answers of exact_match."""
    return max(exact_match(prediction, g) for g in _golds(golds))


def best_sub_em(prediction: str, golds: str | list[str]) -> float:
    """max over gold answers of sub_exact_match."""
    return max(sub_exact_match(prediction, g) for g in _golds(golds))


def best_f1(prediction: str, golds: str | list[str]) -> float:
    """max over gold answers of f1_score."""
    return max(f1_score(prediction, g) for g in _golds(golds))


def qa_metrics(prediction: str, golds: str | list[str]) -> dict[str, float]:
    """{"em", "sub_em", "f1"}, each the max over gold answers."""
    return {
        "em": best_em(prediction, golds),
        "sub_em": best_sub_em(prediction, golds),
        "f1": best_f1(prediction, golds),
    }


def boxed_em_reward(response_text: str, golds: str | list[str]) -> float:
    """Training reward: 1.0 if the last `\\boxed{}` content exactly matches any gold (normalized), else 0.0."""
    boxed = extract_boxed(response_text)
    if boxed is None:
        return 0.0
    return best_em(boxed, golds)
