"""The published evaluations' per-question EM / sub-EM / F1 (`memrl eval metric_rules=...`).

memrl's own metrics (`metric_rules=memrl`, memrl.rewards.qa) drop Unicode punctuation too, never match an
empty prediction and keep every score exact. The published scripts differ in small ways that move their
numbers, so each is offered by name (reimplemented from reading them; docs/DIFFERENCES.md):

- `memagent`: MemAgent's and ReMemR1's evaluations (`taskutils/memory_eval/ruler_hqa.py` / `test_qa.py`
  `get_pred` + `calc_metrics`, `utils/__init__.py` `normalize_answer`, `f1_score`,
  `sub_exact_match_score`, `exact_match_score`; the two repositories hold the same file):
  1. an empty prediction (no answer read) scores 0 on all three (`if item["pred"] else 0`);
  2. normalization: lowercase, ASCII punctuation (`string.punctuation`) removed, the words a/an/the
     removed, whitespace collapsed (no Unicode punctuation rule);
  3. em: normalized strings equal; sub_em: either normalized string contains the other (so a
     prediction such as "The" that normalizes to "" matches every gold); f1: token F1, 0 when either
     side is yes/no/noanswer and they differ;
  4. each of the three rounded to 2 decimals per question (`calc_metrics` over one item), before the
     run's mean.
- `vime`: vime's evaluation (`examples/mem_agent/eval_ruler_hqa.py` `_normalize_answer`, `_f1_score`,
  `_exact_match`, `_sub_exact_match`): the same normalization; no empty-prediction rule, so an empty
  prediction has sub_em 1 ("" is in every gold); f1 has no yes/no rule (0 when either side has no
  tokens); em's yes/no rule changes nothing (it only zeroes unequal pairs); no rounding.

Over several gold answers (golds=any) each metric is the best over them, as memrl's are.

A task's named metric (RULER's string_match_all / _part, memrl.rewards.eval_metrics) under `memagent`
is MemAgent's `ruler_general.py:get_pred` + `calc_metrics`: 0 for an empty prediction, else rounded to 2
decimals per question (1/3 -> 0.33); `memrl` and `vime` keep it as computed.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

METRIC_RULES: tuple[str, ...] = ("memrl", "memagent", "vime")

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = ("yes", "no", "noanswer")


def published_normalize(text: str) -> str:
    """The published SQuAD normalization: lower, ASCII punctuation out, articles out, spaces collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(p: str, g: str, yes_no_rule: bool) -> float:
    if yes_no_rule and (p in _YES_NO or g in _YES_NO) and p != g:
        return 0.0
    pt, gt = p.split(), g.split()
    same = sum((Counter(pt) & Counter(gt)).values())
    if not pt or not gt or same == 0:
        return 0.0
    prec, rec = same / len(pt), same / len(gt)
    return 2 * prec * rec / (prec + rec)


def _one(prediction: str, gold: str, rules: str) -> dict[str, float]:
    if rules == "memagent" and not prediction:
        return {"em": 0.0, "sub_em": 0.0, "f1": 0.0}
    p, g = published_normalize(prediction), published_normalize(gold)
    m = {"em": float(p == g), "sub_em": float(g in p or p in g), "f1": _f1(p, g, yes_no_rule=rules == "memagent")}
    return {k: round(v, 2) for k, v in m.items()} if rules == "memagent" else m


def published_qa_metrics(prediction: str, golds: Sequence[str], rules: str) -> dict[str, float]:
    """{"em", "sub_em", "f1"} under the published `rules` (module docstring), each the best over golds."""
    if rules not in METRIC_RULES[1:]:
        raise ValueError(f"metric_rules must be one of {', '.join(METRIC_RULES)}, got {rules!r}")
    if not golds:
        raise ValueError("no gold answers given: expected a non-empty list of strings")
    per = [_one(prediction or "", g, rules) for g in golds]
    return {k: max(m[k] for m in per) for k in ("em", "sub_em", "f1")}


def published_task_metric(value: float, prediction: str, rules: str) -> float:
    """A task's named eval metric (already computed) under `rules`: MemAgent's empty guard and rounding."""
    if rules == "memagent":
        return round(value, 2) if prediction else 0.0
    return value
