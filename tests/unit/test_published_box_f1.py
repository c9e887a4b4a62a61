"""published_box_f1: the published verifier's answer, scored by HotpotQA token F1 (values worked by hand)."""

from __future__ import annotations

import pytest

from memrl.rewards.verifiers import get_verifier


@pytest.mark.parametrize(
    ("text", "golds", "expected"),
    [
        # exact: verl_hotpotqa gives 1 -> 1
        ("so \\boxed{Paris}", ["Paris"], 1.0),
        # strip_string removes spaces: "new york" == "newyork" for verl_hotpotqa -> 1, though F1 would be 0
        ("\\boxed{newyork}", ["New York"], 1.0),
        # partly right: prediction "the city of paris" -> tokens [city, of, paris] (article dropped),
        # gold [paris]: overlap 1, P = 1/3, R = 1, F1 = 2*(1/3)/(4/3) = 0.5
        ("\\boxed{the city of Paris}", ["Paris"], 0.5),
        # two golds, the best counts: [john, smith] vs [john] -> P 1/2, R 1, F1 2/3; vs [smith jr] -> P 1/2,
        # R 1/2, F1 1/2
        ("\\boxed{John Smith}", ["John", "Smith Jr"], 2 / 3),
        # yes/no differ -> 0 (HotpotQA's rule), no box -> 0, a box outside the last 300 characters -> 0
        ("\\boxed{no}", ["yes"], 0.0),
        ("Paris", ["Paris"], 0.0),
        ("\\boxed{Paris}" + "x" * 300, ["Paris"], 0.0),
    ],
)
def test_published_box_f1(text, golds, expected):
    assert get_verifier("published_box_f1")(text, golds) == pytest.approx(expected, abs=1e-12)
