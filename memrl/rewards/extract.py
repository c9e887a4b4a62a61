"""How evaluation reads a prediction out of the final answer text (`memrl eval extract=...`).

- `boxed` (memrl's default): the content of the last closed `\\boxed{...}` (`memrl.rewards.qa.extract_boxed`);
  empty when there is none.
- `answer_is`: MemAgent's evaluation protocol for its RL models, whose final prompt asks for "Therefore,
  the answer is ..." (`taskutils/memory_eval/utils/__init__.py:extract_solution` + `extract_answer`,
  used by ruler_hqa.py with `--api recurrent`), reimplemented from reading it:
  1. the text after the last `</think>` (stripped) when there is one and it is not empty, else the text;
  2. every `*` removed;
  3. the part after the LAST "the answer is" (case-sensitive: "The answer is" alone is no answer),
     stripped, with DeepSeek's `<｜Assistant｜>` / `<｜end▁of▁sentence｜>` markers removed, stripped, then
     leading and trailing dots stripped, then stripped again;
  4. no "the answer is": no prediction (empty; every metric scores 0).
  Case, inner punctuation and articles are left to the metric's normalization.
- `boxed_published`: the published evaluations' box reader for boxed models (`utils/__init__.py:
  extract_boxed_answer`, MemAgent `--api recurrent-boxed`, ReMemR1 `--api rememr1`), after the same
  `</think>` step as answer_is: over the WHOLE text, case kept, the `\\boxed ans` form first, else the last `\\boxed` matched by brace counting
  (memrl.rewards.verifiers.published_last_box); a box the original would fail an assertion on scores
  as no prediction here.
- `boxed_last300`: vime's evaluation reader (`examples/mem_agent/eval_ruler_hqa.py:run_eval`,
  `_extract_boxed(response[-300:])`): the same published box reader over only the LAST 300 characters
  of the (stripped) final text, case kept (MemAgent's training verifier lowercases first; vime's eval
  does not), no `</think>` step, the unboxed answer stripped; no box there: no prediction.
- `raw`: the whole final text, stripped (what RULER's own harness scores).
"""

from __future__ import annotations

from memrl.rewards.qa import extract_boxed
from memrl.rewards.verifiers import PUBLISHED_WINDOW, published_last_box, published_unbox

EXTRACT_MODES = ("boxed", "answer_is", "boxed_published", "boxed_last300", "raw")

_ANSWER_IS = "the answer is"
_THINK_END = "</think>"
_DEEPSEEK_MARKERS = ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")


def after_think(text: str) -> str:
    """The published `extract_solution` + fallback: the stripped text after the last `</think>`, or the
    whole (stripped) text when there is no `</think>` or nothing follows it."""
    text = (text or "").strip()
    if _THINK_END in text:
        return text.split(_THINK_END)[-1].strip() or text
    return text


def extract_answer_is(text: str) -> str | None:
    """MemAgent's "the answer is" extraction (module docstring); None when the phrase is missing."""
    text = after_think(text).replace("*", "")
    if _ANSWER_IS not in text:
        return None
    ans = text.rsplit(_ANSWER_IS, 1)[-1].strip()
    for marker in _DEEPSEEK_MARKERS:
        ans = ans.replace(marker, "")
    return ans.strip().strip(".").strip()


def extract_prediction(answer_text: str, mode: str) -> str:
    """The prediction `mode` reads from a final answer text ("" when it finds none)."""
    if mode == "boxed":
        return extract_boxed(answer_text or "") or ""
    if mode == "answer_is":
        return extract_answer_is(answer_text) or ""
    if mode == "boxed_published":
        box = published_last_box(after_think(answer_text))
        return (published_unbox(box) if box is not None else None) or ""
    if mode == "boxed_last300":
        box = published_last_box((answer_text or "").strip()[-PUBLISHED_WINDOW:])
        return ((published_unbox(box) if box is not None else None) or "").strip()
    if mode == "raw":
        return (answer_text or "").strip()
    raise ValueError(f"extract must be one of {', '.join(EXTRACT_MODES)}, got {mode!r}")
