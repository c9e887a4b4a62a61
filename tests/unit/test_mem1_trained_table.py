"""benchmarks/mem1_trained.py --trained: mean +- SE over seeds and the peak's growth, by hand on synthetic
results.json files; refusals of mixed evaluations and misplaced runs in one line."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "mem1_trained.py"


def _bench():
    spec = importlib.util.spec_from_file_location("mem1_trained", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mem1_trained"] = mod
    spec.loader.exec_module(mod)
    return mod


def _result(method: str, acc2: float, peak2: float, acc16: float, peak16: float, sha: str = "abc",
            train: tuple[int, ...] = (2, 3)) -> dict:
    def summ(policy: str, mode: str, k: str, acc: float, peak: float) -> dict:
        return {"policy": policy, "decoding": mode, "bucket": k, "accuracy": acc + (10 if policy == "rl" else 0),
                "objective_accuracy": acc + 5, "peak_context_tokens": peak}

    summary = [summ(p, mode, k, acc, peak) for p in ("sft", "rl") for k, acc, peak in (("2", acc2, peak2),
                                                                                    ("16", acc16, peak16))
               for mode in ("greedy", "sampled")]
    return {"method": method, "config": {"eval": {"objectives": [2, 16], "num_tasks": 100},
                                         "task": {"sub_questions": list(train)}},
            "heldout_sha256": [sha], "summary": summary}


def _ms(s: dict) -> list:
    """A cell's (mean, SE) (memrl.eval.stats.stat)."""
    return [s["mean"], s["se"]]


def _write(root: Path, method: str, seed: int, res: dict) -> None:
    d = root / method / "native" / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps(res))


def test_trained_table_by_hand(tmp_path, capsys):
    mod = _bench()
    _write(tmp_path, "mem1", 0, _result("mem1", 50, 100, 30, 150))
    _write(tmp_path, "mem1", 1, _result("mem1", 70, 110, 10, 165))
    _write(tmp_path, "full_history", 0, _result("full_history", 60, 120, 20, 960))
    assert mod.main(["--trained", str(tmp_path), "--json"]) == 0
    agg = json.loads(capsys.readouterr().out)
    m = agg["mem1"]["sft"]["greedy"]
    # accuracy at k=2: 50, 70 -> mean 60, sd sqrt((10^2 + 10^2) / 1) = 14.14, SE 14.14 / sqrt(2) = 10
    assert _ms(m["k"]["2"]["accuracy"]) == pytest.approx([60.0, 10.0])
    # peak at k=2: 100, 110 -> 105, SE 7.07 / sqrt(2) = 5; at k=16: 150, 165 -> 157.5, SE 10.61 / sqrt(2) = 7.5
    assert _ms(m["k"]["2"]["peak_context_tokens"]) == pytest.approx([105.0, 5.0])
    assert _ms(m["k"]["16"]["peak_context_tokens"]) == pytest.approx([157.5, 7.5])
    assert _ms(m["growth"]) == pytest.approx([1.5, 0.0])  # 150 / 100 = 165 / 110 = 1.5
    # slope over k = 2, 16: 50 / 14 = 3.5714 and 55 / 14 = 3.9286 -> mean 3.75, sd 0.2526, SE 0.1786
    assert _ms(m["slope"]) == pytest.approx([3.75, 5 / 14 / 2])
    assert _ms(m["k"]["16"]["objective_accuracy"]) == pytest.approx([25.0, 10.0])  # 35, 15
    assert _ms(agg["mem1"]["rl"]["greedy"]["k"]["16"]["accuracy"]) == pytest.approx([30.0, 10.0])  # 40, 20
    f = agg["full_history"]["sft"]["sampled"]
    assert _ms(f["growth"]) == [8.0, None] and _ms(f["k"]["16"]["accuracy"]) == [20.0, None]  # one seed: no SE
    assert mod.main(["--trained", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "trained (memrl demo --agent mem1) on [2, 3] objectives: 100 held-out tasks" in text
    assert "| mem1 | SFT | greedy | 2 | 2 | 60.0 ± 10.0 | 65.0 ± 10.0 | 105 ± 5 |" in text
    assert "| full_history | SFT + RL | sampled | 1 | 16 | 30.0 ± n/a | 25.0 ± n/a | 960 ± n/a |" in text  # objectives: SFT's 20 + 5
    # full history: (960 - 120) / 14 = 60 tokens per objective
    assert "| full_history | SFT | greedy | 8.00 ± n/a | 60.0 ± n/a |" in text
    assert "| mem1 | SFT | greedy | 1.50 ± 0.00 | 3.8 ± 0.2 |" in text


def test_slope_by_hand():
    # k = 2, 4, 8 (mean 14/3), peaks 10, 20, 24 (mean 18): sum dk*dy = 64/3 - 4/3 + 60/3 = 40,
    # sum dk^2 = (64 + 4 + 100) / 9 = 168/9 -> 40 * 9 / 168 = 15/7
    assert _bench().slope([2, 4, 8], [10, 20, 24]) == pytest.approx(15 / 7)
    assert _bench().slope([2, 16], [77, 77]) == 0.0


def test_trained_refuses_mixed_training_mixtures(tmp_path):
    mod = _bench()
    _write(tmp_path, "mem1", 0, _result("mem1", 50, 100, 30, 150, train=(2, 3, 4)))
    _write(tmp_path, "full_history", 0, _result("full_history", 60, 120, 20, 960))
    with pytest.raises(SystemExit, match="trained on objective counts \\[2, 3\\], .* on \\[2, 3, 4\\]; compare"):
        mod.main(["--trained", str(tmp_path)])


def test_trained_refuses_mixed_evaluations(tmp_path):
    mod = _bench()
    _write(tmp_path, "mem1", 0, _result("mem1", 50, 100, 30, 150))
    _write(tmp_path, "full_history", 0, _result("full_history", 60, 120, 20, 960, sha="other"))
    with pytest.raises(SystemExit, match="evaluated other held-out tasks than .* \\(heldout_sha256 differs\\)"):
        mod.main(["--trained", str(tmp_path)])


def test_trained_refuses_a_run_of_another_method(tmp_path):
    mod = _bench()
    _write(tmp_path, "mem1", 0, _result("full_history", 50, 100, 30, 150))
    with pytest.raises(SystemExit, match="is a run of method 'full_history', not mem1"):
        mod.main(["--trained", str(tmp_path)])


def test_trained_refuses_an_empty_root(tmp_path):
    with pytest.raises(SystemExit, match="no finished run under"):
        _bench().main(["--trained", str(tmp_path)])
