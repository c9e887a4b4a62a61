"""Training verifiers: the outcome reward of a final answer text against the gold answers, by name.

    verify = get_verifier("verl_hotpotqa")
    verify(answer_text, ["Beatles"])  # -> 0.0 or 1.0

`workflow.reward=<name>` picks one for the chunked workflows (memagent, rememr1), or
`workflow.reward=package.module:fn` names your own, a function marked with `@verifier`:

    from memrl.rewards.verifiers import verifier

    @verifier
    def contains_gold(response_text: str, golds: list[str]) -> float:
        return float(any(g.lower() in response_text.lower() for g in golds))

Only marked functions may be named by import path (anything else is refused before it is called).
The built-in ones:

- `boxed_em` (memrl's default): the last `\\boxed{...}` of the whole text, SQuAD-normalized exact match,
  best over all gold answers (`memrl.rewards.qa.boxed_em_reward`).
- `verl_hotpotqa`: the published training verifier of MemAgent and ReMemR1
  (`verl/utils/reward_score/hotpotqa.py:compute_score`, reward_metric "em"; vime's
  `examples/mem_agent/rollout.py:reward_func` differs only as noted at the end), reimplemented from
  reading it:
  1. only the LAST 300 characters of the response count, lowercased;
  2. if the window contains `\\boxed ` (boxed + one space) anywhere, the answer is the text after the
     last `\\boxed ` up to the next `$` (the "`\\boxed ans`" form), and this wins over any `\\boxed{}`;
  3. otherwise the last `\\boxed` is matched to its closing brace by counting every `{` and `}` from
     there on (nested braces kept); no closing brace, or a box not written `\\boxed{` (`\\fbox{}`,
     `\\boxed\\n{}`), scores 0; with no `\\boxed` at all the answer is none and scores 0;
  4. answer and each gold (lowercased) are compared after `strip_string` (below): articles and
     punctuation stay and matter, every space is removed, some LaTeX is dropped;
  5. the score is the max over the gold list (a list of one for HotpotQA).
  One departure: vime does not lowercase the window before looking for the box, so `\\BOXED{x}` scores
  there 0 and here (MemAgent's order) as the answer x.
- `published_box_f1` (memrl, a denser training reward): the answer `verl_hotpotqa` reads (rules 1-3 above),
  scored by HotpotQA's token F1 (`memrl.rewards.qa.best_f1`), and 1.0 wherever `verl_hotpotqa` gives 1.0. A
  partly right answer earns part of the reward, so a group of samples that all miss the exact string can still
  differ. Evaluate with `verl_hotpotqa`; this one is for training.
- `format_f1` (memrl, a training reward for a model that has yet to learn the box): half for the format (exactly
  one non-empty `\\boxed{}`, ReMemR1's format term) and half for the reply's words, HotpotQA token F1 of the
  whole reply (every `\\boxed{` opening removed) best over the golds. A box alone earns 0.5 whatever it holds,
  the right answer written plainly 0.5, the right answer boxed and nothing else 1.0; words after the box lower
  the F1. Evaluate with `verl_hotpotqa`; this one is for training.
- `ruler_match` (memrl, format-free): RULER's own `string_match_all` (`memrl.rewards.eval_metrics`): the share
  of the gold values found anywhere in the reply, case-insensitively. The reward of the needle recipe: it pays
  the value carried to the answer, not its format. It does not charge for extra values: a reply listing every
  number its memory holds earns the one it needed, so read it beside a boxed verifier.
- `box_weighted_f1` (memrl, a training reward with no credit for the box alone): the reply's token F1 as in
  `format_f1`, weighted 1.0 with exactly one non-empty `\\boxed{}` and 0.25 without. The right answer boxed
  and nothing else earns 1.0, written plainly 0.25, any wrong answer 0 boxed or not, so a constant box earns
  nothing. Evaluate with `verl_hotpotqa`; this one is for training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memrl.plugins import is_import_path, load_object
from memrl.rewards.eval_metrics import string_match_all
from memrl.rewards.qa import BOX_OPEN, best_f1, boxed_em_reward
from memrl.rewards.steps import format_reward

Verifier = Callable[[str, "str | list[str]"], float]

_VERIFIERS: dict[str, Verifier] = {}
_MARKED: list[Any] = []  # functions @verifier / @register_verifier marked, compared by identity

PUBLISHED_WINDOW = 300
"""Characters at the end of the response that the published verifier reads."""


def register_verifier(name: str) -> Callable[[Verifier], Verifier]:
    """Decorator: register `fn(response_text, golds) -> float` under `name`."""
    def deco(fn: Verifier) -> Verifier:
        _VERIFIERS[name] = verifier(fn)
        return fn

    return deco


def verifier(fn: Verifier) -> Verifier:
    """Mark `fn(response_text, golds) -> float` as a verifier a config may name by import path
    (`workflow.reward=package.module:fn`). Nothing unmarked is ever called."""
    if not callable(fn):
        raise TypeError(f"@verifier needs a function, got {type(fn).__name__}")
    if not any(f is fn for f in _MARKED):
        _MARKED.append(fn)
    return fn


def verifier_names() -> list[str]:
    return sorted(_VERIFIERS)


def _is_marked(obj: Any) -> bool:
    return any(f is obj for f in _MARKED)


def resolve_verifier(path: str, where: str = "workflow.reward") -> Verifier:
    """The @verifier function "package.module:fn" names; a one-line ConfigError naming `where` otherwise
    (bad syntax, module not importable, no such attribute, not a marked verifier)."""
    return load_object(path, where, "a verifier", _is_marked,
                       "only functions marked with @memrl.rewards.verifiers.verifier may be named")


def check_verifier(name: str, where: str = "workflow.reward") -> None:
    """Raise a one-line error (ValueError) when `name` is neither a registered verifier nor the import path
    of a @verifier function."""
    if is_import_path(name):
        resolve_verifier(name, where)
    elif name not in _VERIFIERS:
        raise ValueError(f"{where} must be one of {', '.join(verifier_names())}, got {name!r} (or the import "
                         "path module:fn of a @memrl.rewards.verifiers.verifier function)")


def get_verifier(name: str) -> Verifier:
    """The registered verifier `name`, or the @verifier function an import path names; a KeyError listing
    the registered names for an unknown name (a ConfigError for a bad import path)."""
    if is_import_path(name):
        return resolve_verifier(name)
    if name not in _VERIFIERS:
        raise KeyError(f"unknown reward verifier {name!r}; registered: {', '.join(verifier_names())}")
    return _VERIFIERS[name]


def _gold_list(golds: str | list[str]) -> list[str]:
    # Task.answers is always a list; a bare string is one answer (the published code would iterate its
    # characters, never intended). An empty list is an error, as in memrl.rewards.qa.
    out = [golds] if isinstance(golds, str) else list(golds)
    if not out:
        raise ValueError("no gold answers given: expected a non-empty list of strings")
    return out


@register_verifier("boxed_em")
def boxed_em(response_text: str, golds: str | list[str]) -> float:
    """memrl's rule: exact match (SQuAD normalization) of the last closed `\\boxed{}` to any gold."""
    return boxed_em_reward(response_text, golds)


# ------------------------------------------------------------------ the published verifier

_SPACE_BOX = "\\boxed "
_BRACE_BOX = "\\boxed{"


def published_last_box(text: str) -> str | None:
    """The published `last_boxed_only_string`: `\\boxed <ans>` up to `$` when the text has a `\\boxed `
    anywhere, else from the last `\\boxed` (or, with none, the last `\\fbox`) through the brace that
    brings the count of `{` minus `}` back to 0; None when there is no box or it never closes."""
    if _SPACE_BOX in text:
        return _SPACE_BOX + text.split(_SPACE_BOX)[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def published_unbox(box: str) -> str | None:
    """The published `remove_boxed`; None where the original's assertions fail (scored 0 there)."""
    if _SPACE_BOX in box:
        return box[len(_SPACE_BOX) :] if box.startswith(_SPACE_BOX) else None
    if box.startswith(_BRACE_BOX) and box.endswith("}"):
        return box[len(_BRACE_BOX) : -1]
    return None


# (old, new) in the published order; the order matters (e.g. " ." -> " 0." happens before spaces go).
_STRIP_STEPS = (
    ("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
    ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("\\%", ""), (" .", " 0."),
    ("{.", "{0."), (" ", ""),
)  # fmt: skip


def published_strip_string(s: str) -> str:
    """The published `strip_string` (a MATH normalizer): drop newlines, `\\!`, `\\left`/`\\right`,
    degree marks, `\\$`, `\\%`; `\\\\` -> `\\`; tfrac/dfrac -> frac; " ." -> " 0.", "{." -> "{0.";
    then remove every space. No lowercasing here (the caller lowercases), no article or punctuation rule."""
    for old, new in _STRIP_STEPS:
        s = s.replace(old, new)
    return s


def published_answer(response_text: str) -> str | None:
    """The answer the published verifier reads: unboxed from the last 300 characters, lowercased."""
    window = (response_text or "")[-PUBLISHED_WINDOW:].lower()
    box = published_last_box(window)
    return None if box is None else published_unbox(box)


@register_verifier("verl_hotpotqa")
def verl_hotpotqa(response_text: str, golds: str | list[str]) -> float:
    """The published training verifier (module docstring): 1.0 when strip_string(answer) ==
    strip_string(gold.lower()) for some gold, the answer read from the last 300 characters."""
    gold_list = _gold_list(golds)
    answer = published_answer(response_text)
    if answer is None:
        return 0.0
    return float(_published_match(answer, gold_list))


def _published_match(answer: str, gold_list: list[str]) -> bool:
    """The published rule 4: strip_string(answer) == strip_string(gold.lower()) for some gold."""
    mine = published_strip_string(answer)
    return any(mine == published_strip_string(g.lower()) for g in gold_list)


@register_verifier("published_box_f1")
def published_box_f1(response_text: str, golds: str | list[str]) -> float:
    """The answer verl_hotpotqa reads (last 300 characters, last box), HotpotQA token F1 best over the golds;
    1.0 where verl_hotpotqa gives 1.0 (its strip_string can match where F1's normalization does not)."""
    gold_list = _gold_list(golds)
    answer = published_answer(response_text)  # read once, for both rules
    if answer is None:
        return 0.0
    return 1.0 if _published_match(answer, gold_list) else best_f1(answer, gold_list)


@register_verifier("format_f1")
def format_f1(response_text: str, golds: str | list[str]) -> float:
    """0.5 * (exactly one non-empty box) + 0.5 * token F1 of the reply, box openings removed, best over the
    golds (module docstring)."""
    boxed, f1 = _boxed_once_and_reply_f1(response_text, golds)
    return 0.5 * boxed + 0.5 * f1


def _boxed_once_and_reply_f1(response_text: str, golds: str | list[str]) -> tuple[float, float]:
    """(1.0 for exactly one non-empty box else 0.0, token F1 of the reply with box openings removed, best over
    the golds): the two parts format_f1 and box_weighted_f1 are made of."""
    text = response_text or ""
    return format_reward(text, final=True), best_f1(BOX_OPEN.sub(" ", text), _gold_list(golds))


UNBOXED_WEIGHT = 0.25
"""box_weighted_f1's weight on a reply without exactly one non-empty box (a boxed one weighs 1.0)."""


@register_verifier("box_weighted_f1")
def box_weighted_f1(response_text: str, golds: str | list[str]) -> float:
    """Token F1 of the reply (box openings removed, best over the golds), times 1.0 with exactly one non-empty
    box and UNBOXED_WEIGHT without (module docstring): no credit for a box that holds a wrong answer."""
    boxed, f1 = _boxed_once_and_reply_f1(response_text, golds)
    return (1.0 if boxed else UNBOXED_WEIGHT) * f1


@register_verifier("ruler_match")
def ruler_match(response_text: str, golds: str | list[str]) -> float:
    """RULER's string_match_all: the share of the golds contained in the reply, case-insensitively (module
    docstring)."""
    return string_match_all(response_text or "", _gold_list(golds))
