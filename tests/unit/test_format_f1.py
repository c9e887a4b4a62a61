"""format_f1: half for exactly one non-empty box, half for the reply's token F1 (values worked by hand)."""

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
