"""benchmarks/infmem_mem1_effects.py runs at a tiny setting and its oracle rows hold the hand-derived counts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import infmem_mem1_effects as bench  # noqa: E402


def test_tiny_setting_counts():
    out = bench.main(["--tasks", "2", "--lengths", "2", "--objectives", "2,4", "--json"])
    ma, im = out["infmem"]
    assert ma["accuracy"] == im["accuracy"] == 100.0
    # MemAgent: one call per chunk + the final; the 2 pieces of 48 words are 3 chunks of 48 tokens here
    assert ma["model_calls"] == ma["chunks"] + 1 == 4
    # InfMem's oracle: plan (retrieve the key, top_k 1) -> memory (the fact) -> plan: STOP -> final = 4 calls,
    # having read one chunk of 48 tokens
    assert (im["model_calls"], im["tokens_read"]) == (4, 48.0)
    rows = {(r["context"], r["objectives"]): r for r in out["mem1"]}
    for k in (2, 4):
        latest, full = rows[("latest_state", k)], rows[("full_history", k)]
        assert latest["model_calls"] == full["model_calls"] == k + 1  # one search per objective, then the answer
        assert latest["accuracy"] == full["accuracy"] == 100.0
        assert latest["carried_tokens"] < full["carried_tokens"]
    # full history carries every turn: more objectives, more carried; MEM1 carries one state + one observation
    assert rows[("full_history", 4)]["carried_tokens"] > 1.5 * rows[("full_history", 2)]["carried_tokens"]
