"""LoCoMo's official QA score (snap-research/locomo, `task_eval/evaluation.py`: `eval_question_answering`),
reimplemented from reading it; `locomo_f1` in memrl eval's rows (the eval metric a LoCoMo task names).

Normalization (`normalize`): every comma removed, lowercased, ASCII punctuation removed, the words a, an,
the AND "and" removed, whitespace collapsed. Token F1 (`stemmed_f1`): each token Porter-stemmed (NLTK's
default stemmer, memrl.rewards.porter), then the usual precision / recall / F1 over the token multisets;
0 when nothing is shared. Per category (the number in locomo10.json, memrl.data.locomo.CATEGORIES):

- 1 (multi-hop): prediction and gold are each split at commas into parts (stripped); the score is the mean
  over the gold parts of the best `stemmed_f1` against any predicted part;
- 2 (temporal) and 4 (single-hop): `stemmed_f1` of prediction and gold;
- 3 (open-domain): the same against the gold's text before its first ";" (stripped);
- 5 (adversarial): 1 when the lowercased prediction contains "no information available" or "not
  mentioned", else 0.

Numeric gold answers are compared as their text (str()). Over several golds (not LoCoMo's layout: one)
the best is taken.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from memrl.rewards.porter import stem

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
ABSTAIN_PHRASES = ("no information available", "not mentioned")
"""What an adversarial (category 5) prediction must contain to score (lowercased substring)."""


def normalize(text: str) -> str:
    """LoCoMo's answer normalization (module docstring)."""
    text = "".join(ch for ch in text.replace(",", "").lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def stemmed_f1(prediction: str, gold: str) -> float:
    """Token F1 over Porter-stemmed normalized tokens; 0 when no token is shared."""
    p = [stem(w) for w in normalize(prediction).split()]
    g = [stem(w) for w in normalize(gold).split()]
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, gold: str) -> float:
    """Category 1: mean over the gold's comma-separated parts of the best F1 against a predicted part."""
    preds = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(stemmed_f1(p, g) for p in preds) for g in golds) / len(golds)


def says_not_mentioned(prediction: str) -> float:
    """Category 5: 1.0 when the prediction says the answer is not in the conversation (ABSTAIN_PHRASES)."""
    low = prediction.lower()
    return float(any(phrase in low for phrase in ABSTAIN_PHRASES))


def locomo_score(prediction: str, gold: str, category: int) -> float:
    """The official score of one prediction against one gold answer under `category` (1-5)."""
    if category == 5:
        return says_not_mentioned(prediction)
    if category == 1:
        return multi_answer_f1(prediction, gold)
    if category == 3:
        return stemmed_f1(prediction, gold.split(";")[0].strip())
    if category in (2, 4):
        return stemmed_f1(prediction, gold)
    raise ValueError(f"LoCoMo category must be 1-5, got {category!r}")


def locomo_f1(prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> float:
    """The eval metric `locomo_f1`: `locomo_score` under the task's meta["category"], best over references."""
    category = meta.get("category")
    if not isinstance(category, int) or isinstance(category, bool):
        raise ValueError(f"locomo_f1 needs the task's meta['category'] (1-5), got {category!r}")
    return max(locomo_score(prediction or "", str(r), category) for r in references)
