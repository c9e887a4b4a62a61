"""benchmarks/vs_trl.py without TRL: its arguments, the shared `lenient` verifier, the summary and the table."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vs_trl", ROOT / "benchmarks" / "vs_trl.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vs_trl"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_args_and_order(bench):
    a = bench.parse(["--steps", "2", "--order", "trl,memrl"])
    assert (a.steps, a.n, a.prompts, a.order) == (2, 4, 1, "trl,memrl")
    with pytest.raises(SystemExit):
        bench.parse(["--order", "memrl"])


def test_lenient_is_a_marked_verifier(bench):
    from memrl.rewards.verifiers import get_verifier

    assert get_verifier("vs_trl:lenient") is bench.lenient
    assert bench.lenient("I think it is The Beatles.", ["beatles"]) == 1.0
    assert bench.lenient("no idea", ["beatles"]) == 0.0


def test_summary_skips_the_first_step_and_table_has_ratio(bench):
    rows = [{"step": 1, "step_s": 10.0, "gen_s": 8.0, "gen_tokens": 80, "update_tokens": 400, "reward": 0.0},
            {"step": 2, "step_s": 4.0, "gen_s": 2.0, "gen_tokens": 40, "update_tokens": 200, "reward": 0.5}]
    s = bench.summarize(rows)
    assert (s["step_s"], s["gen_tok_s"], s["update_tok_s"], s["reward"]) == (4.0, 20.0, 100.0, 0.25)
    other = {**{k: 2 * v for k, v in s.items()}, "rss_mib": 100.0, "wall_s": 1.0, "rows": rows[:1]}
    text = bench.table({"memrl": {**s, "rss_mib": 50.0, "wall_s": 1.0, "rows": rows}, "trl": other})
    assert "| step time (s, median) | 4 | 8 | 0.50 |" in text
    assert "| peak RSS (MiB) | 50 | 100 | 0.50 |" in text
    assert "| 2 | 0.5 | - | 4 | - |" in text
    assert math.isnan(bench.summarize([])["step_s"])
