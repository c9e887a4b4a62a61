"""Per-task evaluation metrics named by a task's `meta["metric"]`, registered by name.

A metric is `fn(prediction, references) -> float` in [0, 1] for one question; eval rows store it under
its name and report tables show the mean over questions x 100. The references are ALL of the task's
answers (a RULER task's `outputs`), whatever `golds` says: these metrics are defined over the list.

RULER's two string metrics (NVIDIA/RULER `scripts/eval/synthetic/constants.py`), reimplemented from
reading them; the prediction is first cleaned as RULER's `evaluate.py:postprocess_pred` does (strip,
every control character U+0000-U+001F becomes a newline, strip):

- `string_match_all`: the fraction of references found in the prediction, case-insensitive substring
  (niah, variable tracking, common / frequent words extraction);
- `string_match_part`: 1 if any reference is found, else 0 (RULER's qa tasks).

RULER averages these over samples, x 100, rounded to 2 decimals; memrl reports the same mean unrounded.

A metric registered with `uses_meta=True` is `fn(prediction, references, meta)`: it also reads the task's
meta (its category or question type). The conversational benchmarks' are:

- `locomo_f1`: LoCoMo's official QA score, category by category (memrl.rewards.locomo);
- `longmemeval_rule`: memrl's rule score for LongMemEval, NOT the official one (that is an LLM judge's,
  `longmemeval_judge`: memrl.rewards.longmemeval).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memrl.rewards import locomo, longmemeval

EvalMetric = Callable[..., float]

_METRICS: dict[str, EvalMetric] = {}
_USES_META: set[str] = set()
_CONTROL = re.compile(r"[\x00-\x1f]")


def register_metric(name: str, uses_meta: bool = False) -> Callable[[EvalMetric], EvalMetric]:
    """Decorator: register `fn(prediction, references) -> float` as eval metric `name` (with uses_meta:
    `fn(prediction, references, meta)`, meta = the task's)."""
    def deco(fn: EvalMetric) -> EvalMetric:
        _METRICS[name] = fn
        _USES_META.discard(name)
        if uses_meta:
            _USES_META.add(name)
        return fn

    return deco


def metric_value(name: str, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> float:
    """Eval metric `name` of one prediction (KeyError for an unknown name, as get_metric)."""
    fn = get_metric(name)
    return fn(prediction, references, meta) if name in _USES_META else fn(prediction, references)


def metric_names() -> list[str]:
    return sorted(_METRICS)


def get_metric(name: str) -> EvalMetric:
    if name not in _METRICS:
        raise KeyError(f"unknown eval metric {name!r}; registered: {', '.join(metric_names())}")
    return _METRICS[name]


def ruler_postprocess(prediction: str) -> str:
    """RULER's cleanup of a prediction: strip, control characters -> newline, strip."""
    return _CONTROL.sub("\n", (prediction or "").strip()).strip()


def _refs(references: Sequence[str] | str) -> list[str]:
    refs = [references] if isinstance(references, str) else list(references)
    if not refs:
        raise ValueError("no references given: expected a non-empty list of strings")
    return refs


@register_metric("string_match_all")
def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of references that occur in the prediction (case-insensitive substring)."""
    pred = ruler_postprocess(prediction).lower()
    refs = _refs(references)
    return sum(1.0 for r in refs if r.lower() in pred) / len(refs)


@register_metric("string_match_part")
def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 when at least one reference occurs in the prediction (case-insensitive substring)."""
    pred = ruler_postprocess(prediction).lower()
    return float(any(r.lower() in pred for r in _refs(references)))


register_metric("locomo_f1", uses_meta=True)(locomo.locomo_f1)
register_metric("longmemeval_rule", uses_meta=True)(longmemeval.longmemeval_rule)
