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
    assert rows["react (unbounded)"][2] == "100.0 ± 0.0" and rows["react"][2] == "0.0 ± 0.0"
    assert rows["react"][-1] == "100% |"  # stopped by the budget
    assert rows["sliding_window k=2"][2] == "0.0 ± 0.0" and rows["summarize"][2] == "100.0 ± 0.0"
    assert rows["fold"][2] == "100.0 ± 0.0" and rows["fold"][8] == "5.00"  # one branch per fact
    assert "policy: the scripted cold-start agents (not trained)" in out


def _bench():
    spec = importlib.util.spec_from_file_location("context_management", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["context_management"] = mod
    spec.loader.exec_module(mod)
    return mod


def _summary(acc: float, peak: float, branches: float = 0.0, summaries: float = 0.0, stopped: float = 0.0) -> dict:
    return {"accuracy": acc, "accuracy_se": 0.0, "peak_context_tokens": peak, "mean_context_tokens": peak / 2,
            "tokens_discarded": 10.0 * branches, "turns": 4.0, "branches": branches, "summaries": summaries,
            "stopped_by_budget": stopped, "num_tasks": 4.0}


def _write(root: Path, method: str, seed: str, acc_rl: float, peak_rl: float, unbounded: float, budget: int,
           eval_tasks: int = 4, branches_rl: float = 5.0, stopped_rl: float = 0.0) -> None:
    import json

    d = root / method / seed
    d.mkdir(parents=True)
    rows = [("react_unbounded", "greedy", _summary(100.0, unbounded)), ("sft", "greedy", _summary(25.0, 300.0)),
            ("sft", "sampled", _summary(0.0, 200.0)),
            ("rl", "greedy", _summary(acc_rl, peak_rl, branches=branches_rl, stopped=stopped_rl)),
            ("rl", "sampled", _summary(acc_rl / 2, peak_rl))]
    res = {"method": method, "facts": {"budget": {"max_context_tokens": budget, "eval_tasks": eval_tasks}},
           "summary": [{"policy": p, "decoding": m, "bucket": "all", **s} for p, m, s in rows]}
    (d / "results.json").write_text(json.dumps(res))


def test_trained_table_is_mean_and_se_over_seeds(tmp_path, capsys):
    mod = _bench()
    # fold: 3 seeds, RL greedy accuracy 50, 75, 100 -> mean 75; sd (ddof 1) = sqrt((625 + 0 + 625) / 2) = 25,
    # SE = 25 / sqrt(3) = 14.43; peaks 400, 500, 600 -> 500 +- 100 / sqrt(3) = 57.7; vs unbounded:
    # 400/800, 500/800, 600/1000 = 0.5, 0.625, 0.6 -> mean 0.575, sd = sqrt((0.075^2 + 0.05^2 + 0.025^2) / 2)
    # = sqrt(0.00875 / 2) = 0.066144, SE 0.038188 -> "58 +- 4%"
    _write(tmp_path, "fold", "seed0", 50.0, 400.0, 800.0, 480)
    _write(tmp_path, "fold", "seed1", 75.0, 500.0, 800.0, 480)
    _write(tmp_path, "fold", "seed2", 100.0, 600.0, 1000.0, 490)
    # react: one seed -> SE n/a
    _write(tmp_path / "x", "react", "seed0", 0.0, 350.0, 700.0, 480)  # not under ROOT: ignored
    _write(tmp_path, "react", "seed0", 0.0, 350.0, 700.0, 480)
    agg = mod.trained_aggregate(mod.trained_runs(tmp_path))
    assert list(agg) == ["react", "fold"] and agg["fold"]["seeds"] == ["seed0", "seed1", "seed2"]
    acc = agg["fold"]["rl"]["greedy"]["accuracy"]
    assert acc["mean"] == 75.0 and abs(acc["se"] - 25 / 3 ** 0.5) < 1e-9
    vs = agg["fold"]["rl"]["greedy"]["vs_unbounded"]
    assert abs(vs["mean"] - 0.575) < 1e-12 and abs(vs["se"] - (0.00875 / 2) ** 0.5 / 3 ** 0.5) < 1e-12
    assert agg["fold"]["rl"]["sampled"]["accuracy"]["mean"] == 37.5  # 25, 37.5, 50
    r = agg["react"]["rl"]["greedy"]["accuracy"]
    assert (r["mean"], r["se"], r["n"]) == (0.0, None, 1)
    assert mod.main(["--trained", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| fold | SFT + RL | 3 | 75.0 ± 14.4 | 500 ± 58 | 58 ± 4% |" in out
    assert "| react | SFT + RL | 1 | 0.0 ± n/a | 350 ± n/a | 50 ± n/a% |" in out
    assert "budgets (tokens of each run's tokenizer): react 480 ± n/a, fold 483 ± 3" in out  # sd 5.77 / sqrt 3


def test_trained_refuses_a_run_of_another_method_and_mixed_task_counts(tmp_path):
    import pytest

    mod = _bench()
    _write(tmp_path, "fold", "seed0", 50.0, 400.0, 800.0, 480)
    _write(tmp_path, "summarize", "seed0", 50.0, 400.0, 800.0, 480, eval_tasks=8)
    with pytest.raises(SystemExit, match="different numbers of held-out tasks: \\[4, 8\\]"):
        mod.main(["--trained", str(tmp_path)])
    _write(tmp_path / "b", "fold", "seed0", 50.0, 400.0, 800.0, 480)
    (tmp_path / "b" / "fold" / "seed0").rename(tmp_path / "b" / "fold" / "tmp")
    (tmp_path / "b" / "window").mkdir()
    (tmp_path / "b" / "fold" / "tmp").rename(tmp_path / "b" / "window" / "seed0")
    with pytest.raises(SystemExit, match="is a run of method 'fold', not window"):
        mod.main(["--trained", str(tmp_path / "b")])
    with pytest.raises(SystemExit, match="no finished run"):
        mod.main(["--trained", str(tmp_path / "empty")])


def test_process_reward_ablation_is_paired_by_seed(tmp_path, capsys):
    import json

    import pytest

    mod = _bench()
    # fold RL greedy (accuracy, peak): seed0 (50, 400), seed1 (75, 500), seed2 (100, 600) but seed2 has no
    # fold_no_process run, so only seeds 0 and 1 pair. fold_no_process: seed0 (40, 420), seed1 (85, 500).
    # Greedy accuracy differences 10, -10: mean 0, sd sqrt(200 / 1) = 14.142, SE 14.142 / sqrt 2 = 10.0.
    # Peaks -20, 0: mean -10, SE 10. Turns 4 - 4 = 0 in both. Sampled accuracy is half the greedy one in
    # _write: 25 - 20 = 5 and 37.5 - 42.5 = -5, mean 0, SE 5.0; sampled peaks as greedy. Greedy branches:
    # fold 5 in both seeds, fold_no_process 4 and 5 -> 1, 0: mean 0.5, sd sqrt(0.5) = 0.7071, SE 0.5. Greedy
    # stopped by the budget: fold 0%, fold_no_process 30% and 10% -> -30, -10: mean -20, SE 10. Sampled: 0 and 0.
    for seed, acc, peak in (("seed0", 50.0, 400.0), ("seed1", 75.0, 500.0), ("seed2", 100.0, 600.0)):
        _write(tmp_path, "fold", seed, acc, peak, 800.0, 480)
    for seed, acc, peak, branches, stopped in (("seed0", 40.0, 420.0, 4.0, 30.0), ("seed1", 85.0, 500.0, 5.0, 10.0)):
        _write(tmp_path, "fold_no_process", seed, acc, peak, 800.0, 480, branches_rl=branches, stopped_rl=stopped)
    abl = mod.process_reward_ablation(mod.trained_runs(tmp_path))
    assert abl["seeds"] == ["seed0", "seed1"]
    assert abl["greedy"]["accuracy"]["mean"] == 0.0 and abs(abl["greedy"]["accuracy"]["se"] - 10.0) < 1e-9
    assert abl["greedy"]["peak_context_tokens"]["mean"] == -10.0 and abs(abl["greedy"]["peak_context_tokens"]["se"] - 10.0) < 1e-9
    assert (abl["greedy"]["turns"]["mean"], abl["greedy"]["turns"]["se"]) == (0.0, 0.0)
    assert abl["greedy"]["branches"]["mean"] == 0.5 and abs(abl["greedy"]["branches"]["se"] - 0.5) < 1e-9
    assert abl["greedy"]["stopped_by_budget"]["mean"] == -20.0 and abs(abl["greedy"]["stopped_by_budget"]["se"] - 10.0) < 1e-9
    assert abl["sampled"]["accuracy"]["mean"] == 0.0 and abs(abl["sampled"]["accuracy"]["se"] - 5.0) < 1e-9
    assert mod.main(["--trained", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "paired by seed: seed0, seed1):" in out
    assert ("- greedy: accuracy +0.0 ± 10.0 points, peak context -10 ± 10 tokens, turns +0.0 ± 0.0, branches "
            "+0.50 ± 0.50, stopped by the budget -20 ± 10 points") in out
    assert ("- sampled: accuracy +0.0 ± 5.0 points, peak context -10 ± 10 tokens, turns +0.0 ± 0.0, branches "
            "+0.00 ± 0.00, stopped by the budget +0 ± 0 points") in out
    # no fold_no_process run: no ablation line
    _write(tmp_path / "c", "fold", "seed0", 50.0, 400.0, 800.0, 480)
    assert mod.process_reward_ablation(mod.trained_runs(tmp_path / "c")) is None
    # a fold_no_process run that did not start from the fold run's cold start
    p = tmp_path / "fold_no_process" / "seed1" / "results.json"
    res = json.loads(p.read_text())
    sft_greedy = res["summary"][1]
    assert (sft_greedy["policy"], sft_greedy["decoding"]) == ("sft", "greedy")
    sft_greedy["accuracy"] = 30.0
    p.write_text(json.dumps(res))
    with pytest.raises(SystemExit, match="fold/seed1 and fold_no_process/seed1 do not share a cold start"):
        mod.main(["--trained", str(tmp_path)])
