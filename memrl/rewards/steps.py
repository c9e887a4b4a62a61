"""ReMemR1 step rewards, as defined in the paper (arXiv 2509.23040), not as in its released code.

The released code matches tags without DOTALL (multi-line memories are missed) and averages recall over
gold answers; here tags span lines and recall is the MAX over gold answers. All functions are pure.
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


def callback_gain(memory: str, recalled: str | None, golds: str | list[str]) -> float:
    """max(0, recall(memory + recalled) - recall(memory)); 0.0 when nothing was recalled."""
    if not recalled:
        return 0.0
    with_recall = answer_word_recall(f"{memory}\n{recalled}", golds)
    return max(0.0, with_recall - answer_word_recall(memory, golds))


def step_reward(
    response: str,
    golds: str | list[str],
    *,
    final: bool,
    new_memory: str | None = None,
    prev_memory: str | None = None,
    recalled: str | None = None,
    format_weight: float = 1.0,
    memory_weight: float = 1.0,
    callback_weight: float = 1.0,
) -> float:
    """w_f*format + w_m*memory_gain(new, prev) + w_c*callback_gain(new, recalled).

    `recalled` is the past memory retrieved by THIS step's `<recall>` query; its gain is measured
    against this step's new memory. The memory terms are skipped when `new_memory` is None (the final
    step), the callback term when nothing was recalled.
    """
    total = format_weight * format_reward(response, final)
    if new_memory is not None:
        total += memory_weight * memory_gain(new_memory, prev_memory, golds)
        total += callback_weight * callback_gain(new_memory, recalled, golds)
    return total
