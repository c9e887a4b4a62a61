"""benchmarks/long_rows.py's table: hand-made peaks -> the printed ratios, the "est." mark of a full-logits run
not made, and the goal check only at 32K tokens and longer (chunked peak below twice the reference)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "long_rows.py"
_spec = importlib.util.spec_from_file_location("long_rows", _PATH)
assert _spec is not None and _spec.loader is not None
long_rows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(long_rows)
GIB = long_rows.GIB


def test_table_ratios_estimates_and_goal():
    got = {("reference", 2048): {"peak": 0.5 * GIB}, ("chunked", 2048): {"peak": 1.5 * GIB},
           ("full", 2048): {"peak": 6.0 * GIB},
           ("reference", 32768): {"peak": 1.0 * GIB}, ("chunked", 32768): {"peak": 1.5 * GIB},
           ("reference", 65536): {"peak": 2.0 * GIB}, ("chunked", 65536): {"peak": 4.5 * GIB}}
    lines = long_rows.table([2048, 32768, 65536], got, {32768: 90.0 * GIB, 65536: 180.0 * GIB})
    row2k, row32k, row64k = (line.split() for line in lines[1:])
    assert row2k[3:] == ["6.00", "1.50", "4.0x", "3.00x", "-"]  # no goal below 32K
    assert row32k[3:] == ["90.00", "est.", "1.50", "60.0x", "1.50x", "yes"]
    assert row64k[-2:] == ["2.25x", "NO"]
    assert row2k[1] == f"{2047 * 151_936 * 4 / GIB:.2f}"  # one fp32 copy of the row's logits
