"""LongMemEval's scores: the official one is an LLM judge's; memrl adds a rule score that is NOT the official one.

Official (xiaowu0162/LongMemEval, `src/evaluation/evaluate_qa.py`, read for its protocol): GPT-4o
(gpt-4o-2024-08-06) is sent one user message, temperature 0, at most 10 tokens, built from a prompt chosen by
the question: one for single-session-user, single-session-assistant and multi-session questions (the reply
holds the answer, or every step to it; a part of it is not enough), one for temporal-reasoning (the same,
and an off-by-one count of days, weeks or months is still right), one for knowledge-update (a reply that
also mentions older information is right when its updated answer is), one for single-session-preference
(the gold answer is a rubric; the reply is right when it uses the user's information as the rubric asks),
and one for abstention questions (question_id ends in "_abs": right when the reply says the question cannot
be answered from the history). The verdict is correct when the lowercased reply contains "yes". The
published scores are the accuracy per question type, their mean (task-averaged accuracy), the overall
accuracy and the accuracy on abstention questions.

memrl sends the same protocol through its judge client (memrl.rewards.judge.JudgeClient.chat; `memrl eval
judge.url=... judge.model=...`, column `longmemeval_judge`), with prompts in memrl's own words (PROMPTS).
They are not the published text: for the official score, save the published prompts to text files and pass
`judge.prompts_dir=DIR` (one file per kind, PROMPT_KINDS; `{question}`, `{gold}` and `{prediction}` name
the slots, or three `{}` filled in that order, as the published templates are written).

`longmemeval_rule` (always computed, memrl's, not official): an abstention question scores 1 when the
prediction says the information is not available (`abstains`); any other question scores 1 when the
normalized gold answer (memrl.rewards.qa.normalize_answer) occurs in the normalized prediction, and a
temporal-reasoning gold "<n> <unit>" also matches "<n +- 1> <unit>" (the judge's off-by-one allowance).
A preference rubric is rarely met word for word: the rule understates those questions; only the judge
scores them meaningfully.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memrl.rewards.judge import final_part
from memrl.rewards.qa import normalize_answer

PROMPT_KINDS = ("answer", "temporal", "update", "preference", "abstention")
"""The judge prompts, one per kind; `prompt_kind` picks one for a question."""
_KIND_OF_TYPE = {"single-session-user": "answer", "single-session-assistant": "answer", "multi-session": "answer",
                 "temporal-reasoning": "temporal", "knowledge-update": "update",
                 "single-session-preference": "preference"}

_ASK = "Answer with one word, yes or no."
PROMPTS: dict[str, str] = {
    "answer": ("You check whether a chat assistant answered a question correctly.\n\nQuestion: {question}\n"
               "Expected answer: {gold}\nAssistant's reply: {prediction}\n\nSay yes when the reply gives the "
               "expected answer, in any wording, or works all the way to it. Say no when it gives a different "
               "answer or only part of what the expected answer holds. " + _ASK),
    "temporal": ("You check whether a chat assistant answered a question about time correctly.\n\nQuestion: "
                 "{question}\nExpected answer: {gold}\nAssistant's reply: {prediction}\n\nSay yes when the reply "
                 "gives the expected answer, in any wording, or works all the way to it; a count of days, weeks, "
                 "months or years that is off by one still counts as right. Say no when it gives a different "
                 "answer or only part of it. " + _ASK),
    "update": ("You check whether a chat assistant gave the latest value of something that changed over time."
               "\n\nQuestion: {question}\nExpected (latest) answer: {gold}\nAssistant's reply: {prediction}\n\n"
               "Say yes when the reply's answer is the expected latest one, even if it also recalls earlier "
               "values. Say no otherwise. " + _ASK),
    "preference": ("You check whether a chat assistant's reply is personalised to what the user said before."
                   "\n\nRequest: {question}\nWhat a good reply does: {gold}\nAssistant's reply: {prediction}\n\n"
                   "Say yes when the reply draws on the user's own stated preferences or facts in the way "
                   "described; it need not do every part of it. Say no otherwise. " + _ASK),
    "abstention": ("You check whether a chat assistant saw that a question cannot be answered from the "
                   "conversation history.\n\nQuestion: {question}\nWhy it cannot be answered: {gold}\n"
                   "Assistant's reply: {prediction}\n\nSay yes when the reply says the information is missing "
                   "or was never given (it may mention related information that was given). Say no when it "
                   "answers as if it knew. " + _ASK),
}
"""memrl's judge prompts (not the published text; see the module docstring)."""

_SLOTS = re.compile(r"\{(question|gold|prediction)\}")
_POSITIONAL = "{}"


def prompt_kind(question_type: str, abstention: bool) -> str:
    """Which judge prompt a question takes (PROMPT_KINDS)."""
    if abstention:
        return "abstention"
    if question_type not in _KIND_OF_TYPE:
        raise ValueError(f"unknown LongMemEval question_type {question_type!r}; expected one of "
                         f"{', '.join(_KIND_OF_TYPE)}")
    return _KIND_OF_TYPE[question_type]


def check_prompt(text: str, where: str) -> str:
    """`text` if it names the three slots (or holds exactly three `{}`), else ValueError naming `where`."""
    found = set(_SLOTS.findall(text))
    if found == {"question", "gold", "prediction"} or (not found and text.count(_POSITIONAL) == 3):
        return text
    raise ValueError(f"{where}: a judge prompt needs the slots {{question}}, {{gold}} and {{prediction}} (or "
                     f"exactly three {{}}, filled in that order); found {sorted(found) or text.count(_POSITIONAL)}")


def load_prompts(prompts_dir: str | None) -> dict[str, str]:
    """PROMPTS, or the files `<prompts_dir>/<kind>.txt` for every kind (all five must be there)."""
    if not prompts_dir:
        return dict(PROMPTS)
    d = Path(prompts_dir)
    missing = [k for k in PROMPT_KINDS if not (d / f"{k}.txt").is_file()]
    if missing:
        raise ValueError(f"judge.prompts_dir={prompts_dir}: missing {', '.join(f'{k}.txt' for k in missing)} "
                         f"(one prompt file per kind: {', '.join(PROMPT_KINDS)})")
    out = {}
    for k in PROMPT_KINDS:
        path = d / f"{k}.txt"
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"judge.prompts_dir: {path} cannot be read ({e})") from e
        out[k] = check_prompt(text, str(path))
    return out


def render_prompt(template: str, question: str, gold: str, prediction: str) -> str:
    """The prompt with its slots filled (named, or three `{}` in the order question, gold, prediction)."""
    if _SLOTS.search(template):
        values = {"question": question, "gold": gold, "prediction": prediction}
        return _SLOTS.sub(lambda m: values[m.group(1)], template)
    first, second, third, rest = template.split(_POSITIONAL, 3)
    return first + question + second + gold + third + prediction + rest


def judge_prompt(meta: Mapping[str, Any], question: str, gold: str, prediction: str,
                 prompts: Mapping[str, str] | None = None) -> str:
    """The judge's message for one LongMemEval question (its type and abstention flag from `meta`)."""
    kind = prompt_kind(str(meta.get("question_type", "")), bool(meta.get("abstention")))
    return render_prompt((prompts or PROMPTS)[kind], question, gold, prediction)


def verdict_yes(reply: str) -> bool:
    """The published reading of a verdict: correct when the lowercased reply contains "yes" (the final part
    only: a reasoning judge's thinking is dropped first, memrl.rewards.judge.final_part)."""
    return "yes" in final_part(reply).lower()


_NOT_AVAILABLE = re.compile(
    r"\b(not (?:been )?(?:mentioned|available|provided|specified|stated|given|shared|discussed|recorded|known)"
    r"|no (?:information|mention|record|details?|data)|(?:did ?n[o']t|do ?n[o']t|does ?n[o']t|never) "
    r"(?:mention|say|tell|share|specify|know)|never (?:mentioned|said|told|shared|specified)"
    r"|(?:cannot|can ?not|can't|unable to) (?:be )?(?:determine|determined|tell|know|answer|find|say)"
    r"|not enough information|insufficient information|unanswerable|unknown|no way to know)\b")


def abstains(prediction: str) -> bool:
    """Whether a reply says the asked information is not available (memrl's abstention rule)."""
    text = " ".join(prediction.lower().replace("\u2019", "'").split())
    return bool(_NOT_AVAILABLE.search(text))


_COUNT = re.compile(r"\b(\d+) (day|week|month|year|hour|minute)s?\b")


def _within_one(prediction: str, gold: str) -> bool:
    """A gold "<n> <unit>" met by "<n +- 1> <unit>" in the prediction (normalized texts)."""
    m = _COUNT.search(gold)
    if m is None:
        return False
    n, unit = int(m.group(1)), m.group(2)
    return any(abs(int(p.group(1)) - n) <= 1 and p.group(2) == unit for p in _COUNT.finditer(prediction))


def longmemeval_rule(prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> float:
    """The eval metric `longmemeval_rule` (memrl's, not the official judge; module docstring)."""
    prediction = prediction or ""
    if meta.get("abstention"):
        return float(abstains(prediction))
    pred = normalize_answer(prediction)
    if not pred:
        return 0.0
    temporal = meta.get("question_type") == "temporal-reasoning"
    for ref in references:
        gold = normalize_answer(str(ref))
        if gold and (f" {gold} " in f" {pred} " or (temporal and _within_one(pred, gold))):
            return 1.0
    return 0.0
