"""benchmarks/context_management.py runs (--dry-run: 2 held-out tasks) and prints one row per method; the
scripted agents' outcomes at the budget are the task's design: the unmanaged agent is stopped by the budget,
the sliding window loses its first facts, summarize and fold answer inside the budget."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks" / "context_management.py"


def test_dry_run_prints_the_table(capsys):
    spec = importlib.util.spec_from_file_location("context_management", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["context_management"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out.splitlines() if line.startswith("| ")
            and not line.startswith("| method")}
    assert list(rows) == ["react (unbounded)", "react", "sliding_window k=2", "summarize", "fold"]
    assert rows["react (unbounded)"][2] == "100.0 +- 0.0" and rows["react"][2] == "0.0 +- 0.0"
    assert rows["react"][-1] == "100% |"  # stopped by the budget
    assert rows["sliding_window k=2"][2] == "0.0 +- 0.0" and rows["summarize"][2] == "100.0 +- 0.0"
    assert rows["fold"][2] == "100.0 +- 0.0" and rows["fold"][8] == "5.00"  # one branch per fact
    assert "policy: the scripted cold-start agents (not trained)" in out
