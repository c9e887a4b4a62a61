"""ReMemR1 step rewards (paper definitions): recall, format, memory gain, callback gain, their sum.
(The released code's callback rule has parity tests in tests/parity/test_rewards_parity.py.)

Every expected value is written out by hand.
"""

from __future__ import annotations

import pytest

from memrl.rewards.steps import (
    answer_word_recall,
    callback_gain,
    format_reward,
    memory_gain,
    released_format_reward,
    released_memory_gain,
    step_reward,
)


@pytest.mark.parametrize(
    "text, golds, expected",
    [
        ("The capital is Paris.\nIt lies in France.", ["Paris France"], 1.0),  # 2/2 words
        ("Memory:\nJohn\nSmith was born in 1901", ["John Smith"], 1.0),  # words split over lines
        ("Obama won", ["Barack Obama", "Obama"], 1.0),  # max(1/2, 1/1) = 1 (a mean would give 0.75)
        ("I like york", ["New York City"], 1 / 3),  # {new, york, city}: only york -> 1/3
        ("new", ["New New York"], 1 / 2),  # gold words de-duplicated: {new, york} -> 1/2
        ("the", ["The"], 0.0),  # gold with no words after normalization is skipped -> 0
        (None, ["Paris"], 0.0),
        ("", ["Paris"], 0.0),
        ("zürich.", ["Zürich"], 1.0),
        ("paris", "Paris", 1.0),  # a single gold string is accepted
    ],
)
def test_answer_word_recall(text, golds, expected):
    assert answer_word_recall(text, golds) == pytest.approx(expected)


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<thinking>x</thinking><update>mem line 1\nline 2</update>", 1.0),  # multi-line update
        ("<thinking>\nx\n</thinking>\n<update>\nmem\n</update>\n<recall>where born</recall>", 1.0),
        ("<update>a</update><update>b</update>", 0.0),  # two updates
        ("<update>a</update><update>b", 0.0),  # a second, unclosed update
        ("<update>  \n </update>", 0.0),  # empty update
        ("<update>mem", 0.0),  # unclosed
        ("no tags at all", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward_memory_step(response, expected):
    assert format_reward(response, final=False) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        (r"<thinking>ok</thinking> \boxed{Paris}", 1.0),
        (r"\boxed{a} \boxed{b}", 0.0),  # two boxes
        (r"\boxed{}", 0.0),  # empty box
        (r"\boxed{Paris", 0.0),  # unclosed
        ("Paris", 0.0),  # no box
    ],
)
def test_format_reward_final_step(response, expected):
    assert format_reward(response, final=True) == expected


def test_memory_gain():
    golds = ["John Smith"]
    # recall(new) = 2/2, recall(prev) = 1/2 -> 1 - 0.5 = 0.5
    assert memory_gain("John Smith lived here", "John", golds) == pytest.approx(0.5)
    # the update dropped both words: 0 - 1 = -1
    assert memory_gain("nothing useful", "John\nSmith", golds) == pytest.approx(-1.0)
    # no previous memory counts as recall 0: 1/2 - 0
    assert memory_gain("John", None, golds) == pytest.approx(0.5)


def test_callback_gain():
    golds = ["John Smith"]
    # held = memory "John" + chunk "": recall 1/2; with "Smith" recalled: 1 -> max(0, 0.5) = 0.5
    assert callback_gain("John", "", "Smith", golds) == pytest.approx(0.5)
    # nothing new in the recalled memory: max(0, 1 - 1) = 0
    assert callback_gain("John Smith", None, "John", golds) == 0.0
    assert callback_gain("John", None, None, golds) == 0.0
    assert callback_gain("John", None, "", golds) == 0.0


def test_callback_gain_ignores_what_the_chunk_already_says():
    """The fix of the callback bug: a recall of a word the current chunk already holds earns nothing.
    The old rule (recall(memory + recalled) - recall(memory)) paid 0.5 here."""
    golds = ["John Smith"]
    # memory "John", chunk "Smith was a carpenter": held recall = 2/2 = 1; recalling "Smith" adds nothing
    assert callback_gain("John", "Smith was a carpenter", "Smith", golds) == 0.0
    # the chunk holds "John", the memory nothing: held 1/2; the recall brings "Smith": 1 - 1/2 = 1/2
    assert callback_gain("No previous memory", "John arrived", "Smith", golds) == pytest.approx(0.5)


def test_step_reward_sums_weighted_terms():
    golds = ["John Smith"]
    response = "<thinking>t</thinking><update>John\nSmith</update><recall>birth</recall>"
    # format 1 + memory gain (1 - 1/2) + callback over (prev "John" + chunk "birth records"):
    # held recall 1/2, with "Smith the carpenter" 1 -> 1/2; total 1 + 0.5 + 0.5 = 2.0
    assert step_reward(
        response,
        golds,
        final=False,
        new_memory="John\nSmith",
        prev_memory="John",
        chunk="birth records",
        recalled="Smith the carpenter",
    ) == pytest.approx(2.0)
    # the chunk already says "Smith": the callback earns 0; format 1 + memory 0.5 + 0 = 1.5
    assert step_reward(
        response,
        golds,
        final=False,
        new_memory="John\nSmith",
        prev_memory="John",
        chunk="Smith was born in 1901",
        recalled="Smith the carpenter",
    ) == pytest.approx(1.5)
    # weights: 0.5 * 1 + 2 * 0.5 + 3 * 0.5 (held "John" + chunk "x": 1/2 -> 1 with "Smith") = 3.0
    assert step_reward(
        response,
        golds,
        final=False,
        new_memory="John\nSmith",
        prev_memory="John",
        chunk="x",
        recalled="Smith",
        format_weight=0.5,
        memory_weight=2.0,
        callback_weight=3.0,
    ) == pytest.approx(3.0)
    # memory "John" from "": gain 1/2; held "" + chunk "John": 1/2, recalled "Smith" completes it: 1/2;
    # total 1 + 0.5 + 0.5
    assert step_reward(
        "<update>John</update>", golds, final=False, new_memory="John", prev_memory="", chunk="John",
        recalled="Smith",
    ) == pytest.approx(2.0)
    # bad format, memory lost a word: 0 + (0 - 1/2) + 0 = -0.5
    assert step_reward("junk", golds, final=False, new_memory="junk", prev_memory="John") == pytest.approx(
        -0.5
    )
    # final step: only the format term
    assert step_reward(r"\boxed{John Smith}", golds, final=True) == 1.0
    with pytest.raises(ValueError, match="callback_rule must be one of paper, released"):
        step_reward("x", golds, final=False, new_memory="x", callback_rule="both")


# The released rules (syr-cn/ReMemR1 @ 43e69f38, verl/trainer/ppo/metric_utils.py): compute_format_rewards
# finds `<update>(.*?)</update>` (memory step) / `\\boxed{(.+)}` (final step) with re.findall WITHOUT
# DOTALL, keeps the bodies whose strip() is non-empty and scores 1 when exactly one is left;
# compute_action_rewards' memory term is R(first update body) - R(first `<memory>(.*?)</memory>` body of
# the prompt), R(x) = mean over golds of (gold words that are substrings of x) / (gold words).
# Paper values in the last column: format_reward (one <update> opened, closed across lines, non-empty).
@pytest.mark.parametrize(
    "response, released, paper",
    [
        ("<thinking>t</thinking>\n<update>John met Smith</update>", 1.0, 1.0),  # one one-line block
        ("<update>John\nSmith</update>", 0.0, 1.0),  # spans two lines: the one-line pattern finds nothing
        ("<update>John</update> <update>Smith</update>", 0.0, 0.0),  # two non-blank blocks
        ("<update> </update>\n<update>Smith</update>", 1.0, 0.0),  # the blank block is not counted
        ("<update></update>", 0.0, 0.0),  # blank only
        ("no tags at all", 0.0, 0.0),
    ],
)
def test_released_format_reward_memory_step(response, released, paper):
    assert released_format_reward(response, final=False) == released
    assert format_reward(response, final=False) == paper


@pytest.mark.parametrize(
    "response, released, paper",
    [
        (r"so \boxed{John}", 1.0, 1.0),
        (r"\boxed{John} or \boxed{Smith}", 1.0, 0.0),  # greedy on one line: one match "John} or \boxed{Smith"
        ("\\boxed{John}\n\\boxed{Smith}", 0.0, 0.0),  # one match per line: two
        ("\\boxed{\nJohn}", 0.0, 1.0),  # the box spans a newline: no one-line match
        (r"\boxed{ }", 0.0, 0.0),  # blank
    ],
)
def test_released_format_reward_final_step(response, released, paper):
    assert released_format_reward(response, final=True) == released
    assert format_reward(response, final=True) == paper


def test_released_memory_gain_by_hand():
    golds = ["John Smith", "Smith"]
    # R over golds: "John Smith" needs "John" and "Smith", "Smith" needs "Smith"; mean of the two fractions.
    layout = "<memory>\nJohn Smith\n</memory>"  # the published layout: the memory on its own lines -> prev ""
    # one-line update "John met Smith": (2/2 + 1/1) / 2 = 1; prev "" -> 0; gain 1
    assert released_memory_gain("<update>John met Smith</update>", layout, golds) == pytest.approx(1.0)
    # multi-line update: no one-line block, new "" -> 0 - 0 = 0 (paper: parsed memory "John\nSmith" -> 1)
    assert released_memory_gain("<update>John\nSmith</update>", layout, golds) == 0.0
    # two updates: the first one counts, "John": (1/2 + 0/1) / 2 = 1/4
    assert released_memory_gain("<update>John</update> <update>Smith</update>", layout, golds) == pytest.approx(0.25)
    # a blank first block is still the first match: R(" ") = 0, whatever the second block says
    assert released_memory_gain("<update> </update>\n<update>Smith</update>", layout, golds) == 0.0
    # case-sensitive substrings: "john smith" holds neither "John" nor "Smith" -> 0 (paper recall: 1);
    # "Johnson of the Smithsonian" holds both as substrings -> 1 (paper recall: 0)
    assert released_memory_gain("<update>john smith</update>", layout, golds) == 0.0
    assert released_memory_gain("<update>Johnson of the Smithsonian</update>", layout, golds) == pytest.approx(1.0)
    # a prompt with a one-line <memory>John</memory>: prev R = (1/2 + 0) / 2 = 1/4; new "Smith": (1/2 + 1) / 2
    # = 3/4; gain 3/4 - 1/4 = 1/2
    assert released_memory_gain("<update>Smith</update>", "x <memory>John</memory> y", golds) == pytest.approx(0.5)
    # and the sum: format 1 + memory 1/2 + callback (paper rule, nothing recalled) 0
    assert step_reward("<update>Smith</update>", golds, final=False, new_memory="Smith", prev_memory="John",
                       prompt="x <memory>John</memory> y", format_rule="released",
                       memory_gain_rule="released") == pytest.approx(1.5)
    with pytest.raises(ValueError, match="format_rule must be one of paper, released"):
        step_reward("x", golds, final=True, format_rule="one_line")
    with pytest.raises(ValueError, match="memory_gain_rule must be one of paper, released"):
        step_reward("x", golds, final=False, new_memory="x", memory_gain_rule="raw")


def test_memagent_memory_recall_metrics():
    from memrl.workflows.memagent import memory_recall_metrics

    golds = ["New York City"]
    # written at call 2, overwritten at call 3: seen but not kept
    mems = ["No previous memory", "born in New York City", "born in Paris"]
    assert memory_recall_metrics(mems, golds) == {"answer_seen": 1.0, "answer_kept": 0.0}
    assert memory_recall_metrics(mems[:2], golds) == {"answer_seen": 1.0, "answer_kept": 1.0}
    # partial answer words are not the answer
    assert memory_recall_metrics(["New York"], golds) == {"answer_seen": 0.0, "answer_kept": 0.0}
    assert memory_recall_metrics(["- Kalo is red"], ["blue", "red"]) == {"answer_seen": 1.0, "answer_kept": 1.0}
    assert memory_recall_metrics([], golds) == {"answer_seen": 0.0, "answer_kept": 0.0}
