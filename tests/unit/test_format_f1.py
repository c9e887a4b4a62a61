"""format_f1 and box_weighted_f1: training rewards from the box and the reply's token F1 (values worked by hand)."""

from __future__ import annotations

import pytest

from memrl.rewards.verifiers import get_verifier


@pytest.mark.parametrize(
    ("text", "golds", "expected"),
    [
        # the right answer boxed and nothing else: 0.5 + 0.5 * 1
        ("\\boxed{Paris}", ["Paris"], 1.0),
        # written plainly: no format half, F1 1
        ("Paris", ["Paris"], 0.5),
        # a constant box: the format half only
        ("\\boxed{2}", ["Paris"], 0.5),
        # words after the box: "paris because paris is" vs [paris]: overlap 1, P 1/4, R 1, F1 0.4 -> 0.5 + 0.2
        ("\\boxed{Paris} because Paris is", ["Paris"], 0.7),
        # two boxes: no format half; "paris paris": P 1/2, R 1, F1 2/3 -> 1/3
        ("\\boxed{Paris} \\boxed{Paris}", ["Paris"], 1 / 3),
        # an empty box is no format; the plain word still scores: 0.5
        ("\\boxed{} Paris", ["Paris"], 0.5),
        # HotpotQA's yes/no rule: "no" against "yes" has F1 0
        ("\\boxed{no}", ["yes"], 0.5),
        # the best gold counts: [john, smith] vs [john]: P 1/2, R 1, F1 2/3 -> 0.5 + 1/3
        ("\\boxed{John Smith}", ["John", "Smith Jr"], 0.5 + 1 / 3),
        ("", ["Paris"], 0.0),
    ],
)
def test_format_f1(text, golds, expected):
    assert get_verifier("format_f1")(text, golds) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("text", "golds", "expected"),
    [
        # the right answer boxed and nothing else: weight 1 x F1 1
        ("\\boxed{Paris}", ["Paris"], 1.0),
        # written plainly: weight 0.25 x F1 1
        ("Paris", ["Paris"], 0.25),
        # a constant box holds no gold word: F1 0, nothing for the box
        ("\\boxed{2}", ["Paris"], 0.0),
        # words after the box: F1 0.4 (as above), boxed once: 0.4
        ("\\boxed{Paris} because Paris is", ["Paris"], 0.4),
        # two boxes: weight 0.25 x F1 2/3
        ("\\boxed{Paris} \\boxed{Paris}", ["Paris"], 0.25 * 2 / 3),
        # an empty box is no box: 0.25 x F1 1
        ("\\boxed{} Paris", ["Paris"], 0.25),
        # the yes/no rule: "no" against "yes" has F1 0 even boxed
        ("\\boxed{no}", ["yes"], 0.0),
        # the best gold: [john, smith] vs [john]: F1 2/3, boxed
        ("\\boxed{John Smith}", ["John", "Smith Jr"], 2 / 3),
        # half the gold's words plainly: [deep, red] vs "deep blue": P 1/2, R 1/2, F1 1/2 -> 0.125
        ("deep blue", ["deep red"], 0.125),
        ("", ["Paris"], 0.0),
    ],
)
def test_box_weighted_f1(text, golds, expected):
    assert get_verifier("box_weighted_f1")(text, golds) == pytest.approx(expected, abs=1e-12)
