"""ReMemR1 step rewards (arXiv 2509.23040). All functions are pure.

memrl's recall is the paper's word-level recall of the gold answer: normalized, de-duplicated words,
MAX over gold answers, tags spanning lines. The released code (`verl/trainer/ppo/metric_utils.py:
compute_action_rewards`) matches tags without DOTALL, AVERAGES over gold answers and tests each raw gold
word as a case-sensitive substring; its callback term is kept here as `callback_rule="released"`.
"""

from __future__ import annotations

import re

from memrl.rewards.qa import count_boxed, normalize_answer

_UPDATE_OPEN = re.compile(r"<update>")
_UPDATE_BLOCK = re.compile(r"<update>(.*?)</update>", re.DOTALL)


def _gold_list(golds: str | list[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def answer_word_recall(text: str | None, golds: str | list[str]) -> float:
    """max_g |words(g) & words(text)| / |words(g)| over golds g; words are normalized and de-duplicated.

    Golds that normalize to nothing are skipped; 0.0 when no gold has a word.
    """
    found = set(normalize_answer(text or "").split())
    best = 0.0
    for gold in _gold_list(golds):
        words = set(normalize_answer(gold).split())
        if words:
            best = max(best, len(words & found) / len(words))
    return best


def format_reward(response: str, final: bool) -> float:
    """1.0 if a memory step has exactly one non-empty `<update>...</update>` (final: one non-empty `\\boxed{}`)."""
    if final:
        opened, filled = count_boxed(response)
        return float(opened == 1 and filled == 1)
    blocks = _UPDATE_BLOCK.findall(response or "")
    opened = len(_UPDATE_OPEN.findall(response or ""))
    return float(opened == 1 and len(blocks) == 1 and bool(blocks[0].strip()))


def memory_gain(new_memory: str, prev_memory: str | None, golds: str | list[str]) -> float:
    """recall(new_memory) - recall(prev_memory); negative when the update dropped gold-answer words."""
    return answer_word_recall(new_memory, golds) - answer_word_recall(prev_memory, golds)


CALLBACK_RULES = ("paper", "released")
"""How a recall is credited: paper = memrl's recall over memory + chunk (default); released = the public
code's recall over the whole step prompt (`released_callback_gain`)."""


def _joined(*parts: str | None) -> str:
    return "\n".join(p for p in parts if p)


def callback_gain(memory: str | None, chunk: str | None, recalled: str | None, golds: str | list[str]) -> float:
    """max(0, recall(m_{t-1} + c_t + r_t) - recall(m_{t-1} + c_t)): a recall earns only the gold-answer
    words that neither the memory the step read (m_{t-1}) nor its chunk (c_t) already hold; 0.0 when
    nothing was recalled. recall = `answer_word_recall` (normalized words, max over golds)."""
    if not recalled:
        return 0.0
    held = _joined(memory, chunk)
    return max(0.0, answer_word_recall(_joined(held, recalled), golds) - answer_word_recall(held, golds))


def released_recall(text: str, golds: str | list[str]) -> float:
    """The released code's recall: mean over golds of the fraction of the gold's whitespace-split words
    (repeats counted, no normalization) found as case-sensitive substrings of `text`; a gold with no
    words adds 0 but still counts in the mean."""
    gold_list = _gold_list(golds)
    if not gold_list:
        return 0.0
    total = 0.0
    for gold in gold_list:
        words = gold.split()
        if words:
            total += sum(1.0 for w in words if w in text) / len(words)
    return total / len(gold_list)


def released_callback_gain(prompt: str, recalled: str, golds: str | list[str]) -> float:
    """The released callback term: max(0, R(recalled + " " + prompt) - R(prompt)), R = `released_recall`,
    prompt = the step's whole prompt (question, shown recalled memory, m_{t-1}, chunk, instructions),
    recalled = what this step's query retrieved, or the "No memory was recalled." text when nothing."""
    return max(0.0, released_recall(f"{recalled} {prompt}", golds) - released_recall(prompt, golds))


def step_reward(
    response: str,
    golds: str | list[str],
    *,
    final: bool,
    new_memory: str | None = None,
    prev_memory: str | None = None,
    chunk: str | None = None,
    recalled: str | None = None,
    format_weight: float = 1.0,
    memory_weight: float = 1.0,
    callback_weight: float = 1.0,
    callback_rule: str = "paper",
    prompt: str | None = None,
) -> float:
    """w_f*format + w_m*memory_gain(new, prev) + w_c*callback.

    callback (paper rule) = callback_gain(prev_memory, chunk, recalled): `recalled` is the past memory
    retrieved by THIS step's `<recall>` query, credited only for gold-answer words that neither the
    memory the step read nor its chunk hold. callback_rule="released": released_callback_gain(prompt,
    recalled) with `prompt` the step's prompt text and `recalled` the retrieved text or the no-recall
    text. The memory terms are skipped when `new_memory` is None (the final step).
    """
    if callback_rule not in CALLBACK_RULES:
        raise ValueError(f"callback_rule must be one of {', '.join(CALLBACK_RULES)}, got {callback_rule!r}")
    total = format_weight * format_reward(response, final)
    if new_memory is not None:
        total += memory_weight * memory_gain(new_memory, prev_memory, golds)
        if callback_rule == "paper":
            total += callback_weight * callback_gain(prev_memory, chunk, recalled, golds)
        else:
            total += callback_weight * released_callback_gain(prompt or "", recalled or "", golds)
    return total
