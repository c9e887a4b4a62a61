"""ReMemR1 step rewards (arXiv 2509.23040). All functions are pure.

memrl's recall is the paper's word-level recall of the gold answer: normalized, de-duplicated words,
MAX over gold answers, tags spanning lines. The released code (`verl/trainer/ppo/metric_utils.py:
compute_action_rewards`) matches tags without DOTALL, AVERAGES over gold answers and tests each raw gold
word as a case-sensitive substring; its callback term is kept here as `callback_rule="released"`, its
format term as `format_rule="released"` and its memory term as `memory_gain_rule="released"`
(`verl/trainer/ppo/metric_utils.py: compute_format_rewards`, `compute_action_rewards`).
"""

from __future__ import annotations

import re

from memrl.rewards.qa import count_boxed, normalize_answer

_UPDATE_OPEN = re.compile(r"<update>")
_UPDATE_BLOCK = re.compile(r"<update>(.*?)</update>", re.DOTALL)


# The released code's patterns are searched without DOTALL: `.` stops at a newline, so a block counts
# only when its open and close tags sit on one line.
_LINE_UPDATE = re.compile(r"<update>(.*?)</update>")
_LINE_BOXED = re.compile(r"\\boxed\{(.+)\}")  # greedy: one match per line, first open to last close
_LINE_MEMORY = re.compile(r"<memory>(.*?)</memory>")


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


FORMAT_RULES = ("paper", "released")
"""The format term: paper = `format_reward` (memrl, default); released = `released_format_reward`."""
MEMORY_GAIN_RULES = ("paper", "released")
"""The memory term: paper = `memory_gain` (memrl, default); released = `released_memory_gain`."""


def released_format_reward(response: str, final: bool) -> float:
    """The released format term (`metric_utils.py: compute_format_rewards`): 1.0 when exactly one block
    with non-blank text is found by the one-line pattern: a memory step's `<update>...</update>`
    (non-greedy, open and close tags on one line; blank blocks are not counted, so a blank block beside a
    filled one still scores 1), a final step's `\\boxed{...}` (greedy within a line: `\\boxed{a} \\boxed{b}`
    on one line is one block). A block spread over several lines is not found."""
    found = (_LINE_BOXED if final else _LINE_UPDATE).findall(response or "")
    return float(sum(1 for body in found if body.strip()) == 1)


def released_memory_gain(response: str, prompt: str | None, golds: str | list[str]) -> float:
    """The released memory term (`metric_utils.py: compute_action_rewards`): R(new) - R(previous), R =
    `released_recall`; new = the text of the response's first one-line `<update>...</update>` (raw, not
    trimmed; "" when there is none), previous = the text of the step prompt's first one-line
    `<memory>...</memory>` ("" when there is none). The published prompt puts the memory on lines of
    its own between the tags, so the previous memory is "" there and the term is R(new)."""
    new = _LINE_UPDATE.search(response or "")
    prev = _LINE_MEMORY.search(prompt or "")
    return released_recall(new.group(1) if new else "", golds) - released_recall(prev.group(1) if prev else "", golds)


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
    format_rule: str = "paper",
    memory_gain_rule: str = "paper",
) -> float:
    """w_f*format + w_m*memory_gain(new, prev) + w_c*callback.

    callback (paper rule) = callback_gain(prev_memory, chunk, recalled): `recalled` is the past memory
    retrieved by THIS step's `<recall>` query, credited only for gold-answer words that neither the
    memory the step read nor its chunk hold. callback_rule="released": released_callback_gain(prompt,
    recalled) with `prompt` the step's prompt text and `recalled` the retrieved text or the no-recall
    text. format_rule="released": `released_format_reward`; memory_gain_rule="released":
    `released_memory_gain(response, prompt)` (`new_memory` / `prev_memory` then unread). The memory terms
    are skipped when `new_memory` is None (the final step).
    """
    for name, value, allowed in (("callback_rule", callback_rule, CALLBACK_RULES),
                                 ("format_rule", format_rule, FORMAT_RULES),
                                 ("memory_gain_rule", memory_gain_rule, MEMORY_GAIN_RULES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    fmt = released_format_reward(response, final) if format_rule == "released" else format_reward(response, final)
    total = format_weight * fmt
    if new_memory is not None:
        if memory_gain_rule == "released":
            total += memory_weight * released_memory_gain(response, prompt, golds)
        else:
            total += memory_weight * memory_gain(new_memory, prev_memory, golds)
        if callback_rule == "paper":
            total += callback_weight * callback_gain(prev_memory, chunk, recalled, golds)
        else:
            total += callback_weight * released_callback_gain(prompt or "", recalled or "", golds)
    return total
