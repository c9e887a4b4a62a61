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
- `raw`: the whole final text, stripped (what RULER's own harness scores).
"""

from __future__ import annotations

from memrl.rewards.qa import extract_boxed

EXTRACT_MODES = ("boxed", "answer_is", "raw")

_ANSWER_IS = "the answer is"
_THINK_END = "</think>"
_DEEPSEEK_MARKERS = ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")


def extract_answer_is(text: str) -> str | None:
    """MemAgent's "the answer is" extraction (module docstring); None when the phrase is missing."""
    text = (text or "").strip()
    if _THINK_END in text:
        after = text.split(_THINK_END)[-1].strip()
        text = after or text  # the published code falls back to the whole response when nothing follows
    text = text.replace("*", "")
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
    if mode == "raw":
        return (answer_text or "").strip()
    raise ValueError(f"extract must be one of {', '.join(EXTRACT_MODES)}, got {mode!r}")
