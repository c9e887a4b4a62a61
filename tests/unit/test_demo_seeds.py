"""`memrl demo --seeds --cpu-capability` (memrl.recipes.seeds): the seed overrides, the fixed held-out tasks, the
aggregation (hand-checked on fabricated results.json files), and the runner's environment and resume logic
(with a stand-in command instead of the demo)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memrl.config import ConfigError
from memrl.errors import UserError
from memrl.eval import stats
from memrl.eval.stats import cell, stat
from memrl.recipes import seeds as sw
from memrl.recipes import tables as tb
from memrl.recipes.pipeline import load_recipe

# ---------------------------------------------------------------------------------------------- the plan


def test_parse_seeds_and_capabilities():
    assert sw.parse_seeds("0,1,2") == [0, 1, 2]
    assert sw.parse_seeds("3") == [3]
    assert sw.parse_capabilities("AVX2, avx512") == ["avx2", "avx512"]
    for bad in ("", "a", "0,0", "-1"):
        with pytest.raises(ConfigError, match="^--seeds: expected"):
            sw.parse_seeds(bad)
    for bad in ("", "sse", "avx2,avx2"):
        with pytest.raises(ConfigError, match="^--cpu-capability: expected distinct values from native, default, "
                                              "avx2, avx512"):
            sw.parse_capabilities(bad)


def test_seed_overrides_shift_every_training_seed_from_the_recipe_defaults():
    ma = sw.base_seeds("memagent", [])
    assert ma == {"seed": 0, "sft_seed": 500, "train.data.seed": 1000, "train.trainer.seed": 0, "eval.seed": 987654}
    assert sw.seed_overrides("memagent", 0, ma) == ["seed=0", "sft_seed=500", "train.data.seed=1000",
                                                    "train.trainer.seed=0"]
    assert sw.seed_overrides("memagent", 2, ma) == ["seed=2", "sft_seed=502", "train.data.seed=1002",
                                                    "train.trainer.seed=2"]
    mc = sw.base_seeds("memact", [])
    assert mc == {"seed": 0, "sft.seed": 500, "rl_task_seed": 100, "train.data.seed": 7, "train.trainer.seed": 0,
                  "eval.seed": 987654}
    assert sw.seed_overrides("memact", 1, mc) == ["seed=1", "sft.seed=501", "rl_task_seed=101", "train.data.seed=8",
                                                  "train.trainer.seed=1"]
    assert sw.base_seeds("memagent", ["eval.seed=5"])["eval.seed"] == 5
    cx = sw.base_seeds("context", ["method=summarize"])  # preset context_cpu: data.seed 7; eval.seed 901
    assert cx == {"seed": 0, "sft.seed": 500, "rl_task_seed": 100, "train.data.seed": 7, "train.trainer.seed": 0,
                  "eval.seed": 901}
    assert sw.seed_overrides("context", 2, cx) == ["seed=2", "sft.seed=502", "rl_task_seed=102",
                                                   "train.data.seed=9", "train.trainer.seed=2"]
    m1 = sw.base_seeds("mem1", ["method=full_history"])  # preset mem1_cpu: data.seed 7; eval.seed 901
    assert m1 == {"seed": 0, "sft.seed": 500, "rl_task_seed": 100, "train.data.seed": 7, "train.trainer.seed": 0,
                  "eval.seed": 901}


def test_plan_is_seed_major_with_one_dir_per_run(tmp_path):
    runs = sw.plan("memagent", tmp_path, [0, 1], ["avx2", "avx512"], ["threads=1"])
    assert [(r.seed, r.capability, r.out) for r in runs] == [
        (0, "avx2", tmp_path / "avx2" / "seed0"), (0, "avx512", tmp_path / "avx512" / "seed0"),
        (1, "avx2", tmp_path / "avx2" / "seed1"), (1, "avx512", tmp_path / "avx512" / "seed1")]
    assert runs[3].overrides == ("threads=1", "seed=1", "sft_seed=501", "train.data.seed=1001",
                                 "train.trainer.seed=1")
    assert sw.run_command("memact", runs[0])[1:] == ["-m", "memrl.cli", "demo", "--agent", "memact", "--out",
                                                     str(tmp_path / "avx2" / "seed0"), "threads=1", "seed=0",
                                                     "sft_seed=500", "train.data.seed=1000", "train.trainer.seed=0"]


def test_plan_refuses_a_shifted_seed_override_and_training_tasks_on_the_eval_seed(tmp_path):
    with pytest.raises(ConfigError, match=r"^--seeds: train.trainer.seed is set by the training seed; drop the "
                                          r"override 'train.trainer.seed=3'$"):
        sw.plan("memagent", tmp_path, [0], ["avx2"], ["train.trainer.seed=3"])
    with pytest.raises(ConfigError, match=r"^--seeds: training seed 1 makes train.data.seed equal eval.seed \(1001\)"):
        sw.plan("memagent", tmp_path, [0, 1], ["avx2"], ["eval.seed=1001"])
    with pytest.raises(ConfigError, match=r"^--seeds: training seed 2 makes rl_task_seed equal eval.seed \(102\)"):
        sw.plan("memact", tmp_path, [0, 2], ["avx2"], ["eval.seed=102"])
    # mem1: one held-out set per objective count k from seed eval.seed + k: eval.seed 98 with k = 2, 4, 8, 16 gives
    # 100, 102, 106, 114, and 100 is training seed 0's rl_task_seed (100 + 0); k = 5, 7 give 103, 105, none of
    # seeds 0, 1's (rl 100, 101; sft 500, 501)
    with pytest.raises(ConfigError, match=r"^--seeds: training seed 0 makes rl_task_seed a held-out task seed "
                                          r"\(100, 102, 106, 114\)"):
        sw.plan("mem1", tmp_path, [0, 1], ["avx2"], ["eval.seed=98"])
    assert len(sw.plan("mem1", tmp_path, [0, 1], ["avx2"], ["eval.seed=98", "eval.objectives=[5,7]"])) == 2


def test_plan_refuses_what_the_table_cannot_aggregate_before_any_run(tmp_path, capsys):
    """Issue 63: `eval.samples=0` was found only when the finished runs were aggregated; a seed past the
    seed range ended in an overflow traceback."""
    for ov, said in [("eval.samples=0", "--seeds: eval.samples=0 leaves no sampled accuracy, and the sweep's table "
                                        "aggregates sampled and greedy accuracy of every run; drop the override"),
                     ("eval.greedy=false", "--seeds: eval.greedy=false leaves no greedy accuracy, and the sweep's "
                                           "table aggregates sampled and greedy accuracy of every run; drop the "
                                           "override")]:
        with pytest.raises(ConfigError) as e:
            sw.plan("memagent", tmp_path, [0, 1], ["native"], [ov])
        assert str(e.value) == said
    with pytest.raises(ConfigError) as e:
        sw.parse_seeds("0,100000000000000000000000")
    assert str(e.value) == "--seeds: seed 100000000000000000000000 is not allowed: must be in [0, 4294967295]"
    with pytest.raises(ConfigError) as e:  # sft_seed 500 + 4294967295 is past the range
        sw.plan("memagent", tmp_path, [0, 4294967295], ["native"], [])
    assert str(e.value) == "--seeds: training seed 4294967295 makes sft_seed=4294967795, past the largest seed 4294967295"
    from memrl.cli import main

    assert main(["demo", "--out", str(tmp_path / "sweep"), "--seeds", "0,1", "eval.samples=0"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == ["memrl demo: error: --seeds: eval.samples=0 leaves no sampled accuracy, and the sweep's table "
                   "aggregates sampled and greedy accuracy of every run; drop the override"]
    assert not (tmp_path / "sweep" / "native").exists()  # no run started


def test_memagent_heldout_tasks_do_not_depend_on_the_training_seed(tmp_path):
    from memrl.recipes.memagent import RECIPE, heldout_tasks

    base = sw.base_seeds("memagent", [])
    tasks = []
    for k in (0, 1, 7):
        run = load_recipe(RECIPE, ["eval.num_tasks=3", *sw.seed_overrides("memagent", k, base)], tmp_path / f"s{k}")
        cfg, tcfg = run.cfg, run.tcfg
        assert (cfg.seed, tcfg.trainer.seed) == (k, k)
        tasks.append({n: [(t.question, t.context, t.answers) for t in ts]
                      for n, ts in heldout_tasks(cfg, tcfg).items()})
    assert list(tasks[0]) == [8, 32, 128] and len(tasks[0][8]) == 3
    assert tasks[0] == tasks[1] == tasks[2]


def test_memact_heldout_tasks_do_not_depend_on_the_training_seed(tmp_path):
    from memrl.config import load_config
    from memrl.recipes.memact import MemActDemoConfig, write_data

    base = sw.base_seeds("memact", [])
    files, sft = [], []
    for k in (0, 1):
        demo_ov = [o for o in sw.seed_overrides("memact", k, base) if not o.startswith("train.")]
        cfg = load_config(MemActDemoConfig, ["sft.num_tasks=3", "rl_tasks=3", "eval.num_tasks=4", *demo_ov])
        data = write_data(cfg, tmp_path / f"s{k}")
        files.append((tmp_path / f"s{k}" / "heldout_tasks.jsonl").read_bytes())
        sft.append([t.question for t in data.sft_tasks])
    assert files[0] == files[1] and files[0].count(b"\n") == 4
    assert sft[0] != sft[1]  # the training tasks do change


# ---------------------------------------------------------------------------------------------- aggregation


def test_sweep_cells_are_mean_sd_of_the_one_statistic():
    c = stat([1.0, 2.0, 4.0])
    assert c["mean"] == pytest.approx(7 / 3) and c["sd"] == pytest.approx((7 / 3) ** 0.5) and c["n"] == 3
    assert stat([5.0]) == {"mean": 5.0, "sd": None, "se": None, "n": 1, "values": [5.0]}
    assert cell(stat([60.0, 62.0, 64.0]), spread="sd") == "62.0 ± 2.0"
    assert cell(stat([5.0]), sign=True, spread="sd") == "+5.0 ± n/a"
    assert cell(tb.cell_of({"cells": {}}, "greedy", "all", "sft_accuracy")) == "-"  # no run has it


def arm_cells(views: list[dict], fields: tuple[str, ...]) -> dict:
    """A benchmark's arms over seeds: each seed's view's long rows (seeds.view_rows), grouped (seeds.cells)."""
    return sw.cells([row for k, view in enumerate(views) for row in sw.view_rows(view, fields, seed=k)])


def test_view_rows_cells_paired_and_diff_se_by_hand():
    """Two arms over seeds 0-2, arm b missing on seed 2: a's accuracy 50, 54, 61 -> mean 55, sd
    sqrt((25 + 1 + 36) / 2) = sqrt(31); b's 52, 50 -> 51 +- sqrt(2); the paired a - b on seeds 0, 1: -2, 4 -> mean
    1, SE sqrt(((-3)^2 + 3^2) / 1) / sqrt(2) = 3. diff_se of standard errors (3, 4) and (4, 3) over two seeds:
    sqrt(9 + 16 + 16 + 9) / 2 = sqrt(50) / 2."""
    def view(acc_a, acc_b=None):
        out = {"a": {"greedy": {"all": {"accuracy": acc_a, "turns": 2}}}}
        if acc_b is not None:
            out["b"] = {"greedy": {"all": {"accuracy": acc_b, "turns": 3}}}
        return out

    assert sw.view_rows(view(61), ("accuracy",), seed=2) == [
        {"seed": 2, "policy": "a", "decoding": "greedy", "bucket": "all", "field": "accuracy", "value": 61.0}]
    c = arm_cells([view(50, 52), view(54, 50), view(61)], ("accuracy", "turns"))["greedy"]["all"]
    assert list(c) == ["a_accuracy", "a_turns", "b_accuracy", "b_turns"]  # first-seen order
    assert c["a_accuracy"]["mean"] == 55.0 and c["a_accuracy"]["sd"] == pytest.approx(31 ** 0.5)
    assert c["a_accuracy"]["values"] == [50.0, 54.0, 61.0] and c["b_accuracy"]["values"] == [52.0, 50.0]
    assert c["b_turns"] == {"mean": 3.0, "sd": 0.0, "se": 0.0, "n": 2, "values": [3.0, 3.0]}
    se = arm_cells([view(50, 52), view(54, 50)], ("accuracy",))["greedy"]["all"]
    assert (se["a_accuracy"]["mean"], se["a_accuracy"]["se"]) == (52.0, 2.0)  # sd 2 sqrt(2) / sqrt(2)
    a, b = {0: 50.0, 1: 54.0, 2: 61.0}, {1: 50.0, 0: 52.0}
    assert stats.paired(a, b, lambda x, y: x - y) == [-2.0, 4.0]  # seeds both have, in a's order
    d = stat(stats.paired(a, b, lambda x, y: x - y))
    assert (d["mean"], d["se"]) == (1.0, 3.0)
    assert stats.paired(a, {}, lambda x, y: x - y) == []
    assert stats.diff_se([3.0, 4.0], [4.0, 3.0]) == pytest.approx(50 ** 0.5 / 2)
    assert stats.diff_se([2.0], [0.0]) == 2.0


def test_cell_bare_and_table_rows_by_decoding():
    assert cell(stat([5.0])) == "5.0 ± n/a" and cell(stat([5.0]), bare=True) == "5.0"
    assert cell(stat([4.75, 5.25]), 2, bare=True) == "5.00 ± 0.25" and cell(None, bare=True) == "-"
    e = {"cells": arm_cells([{arm: {mode: {"all": {"x": v}} for mode in ("greedy", "sampled")}
                                 for arm, v in (("a", 1.0), ("b", 2.0))}], ("x",))}
    labels = (("A", "a"), ("B", "b"))
    assert tb.table_rows(e, labels, ("x",)) == ["| A | greedy | 1.0 ± n/a |", "| A | sampled | 1.0 ± n/a |",
                                                "| B | greedy | 2.0 ± n/a |", "| B | sampled | 2.0 ± n/a |"]
    assert tb.table_rows(e, labels, ("x",), by_decoding=True) == [
        "| A | greedy | 1.0 ± n/a |", "| B | greedy | 2.0 ± n/a |", "| A | sampled | 1.0 ± n/a |",
        "| B | sampled | 2.0 ± n/a |"]

def memagent_result(sft_s: float, rl_s: float, sft_g: float, rl_g: float, heldout: str = "h0") -> dict:
    """A memagent results.json in the one layout: its summary rows (length 32 is length 8 minus 10 points)."""
    rows = [{"policy": "demonstrator", "decoding": "sampled", "bucket": "8", "accuracy": 83.4},
            {"policy": "demonstrator", "decoding": "sampled", "bucket": "32", "accuracy": 44.7}]
    for policy, s, g in (("sft", sft_s, sft_g), ("rl", rl_s, rl_g)):
        rows += [{"policy": policy, "decoding": mode, "bucket": str(n), "accuracy": a - d}
                 for n, d in ((8, 0), (32, 10)) for mode, a in (("sampled", s), ("greedy", g))]
    return {"recipe": "memagent", "method": "memagent", "train": {"data": {"synthetic": {"num_chunks": 8}}},
            "facts": {"lengths": [8, 32]}, "heldout_sha256": [heldout], "summary": rows}


def write_run(run: sw.Run, agent: str, res: dict) -> None:
    run.out.mkdir(parents=True)
    (run.out / sw.MARKER).write_text(json.dumps(sw.marker_of(agent, run)))
    (run.out / "results.json").write_text(json.dumps(res))


def test_memagent_aggregate_by_hand(tmp_path):
    runs = sw.plan("memagent", tmp_path, [0, 1, 2], ["avx2", "avx512"], [])
    by = {(r.seed, r.capability): r for r in runs}
    # avx2: SFT sampled 60/62/64, SFT+RL sampled 90/96/93, greedy 95/97/99 -> 100/100/99
    write_run(by[0, "avx2"], "memagent", memagent_result(60, 90, 95, 100))
    write_run(by[1, "avx2"], "memagent", memagent_result(62, 96, 97, 100))
    write_run(by[2, "avx2"], "memagent", memagent_result(64, 93, 99, 99))
    write_run(by[0, "avx512"], "memagent", memagent_result(70, 80, 90, 90))  # avx512: seed 0 only
    agg = sw.aggregate("memagent", runs)
    a2 = agg["capabilities"]["avx2"]
    assert a2["seeds"] == [0, 1, 2] and a2["pending"] == []
    row, greedy = a2["cells"]["sampled"]["8"], a2["cells"]["greedy"]["8"]  # decoding -> length -> cell
    assert row["sft_accuracy"]["values"] == [60, 62, 64] and row["sft_accuracy"]["sd"] == pytest.approx(2.0)
    assert row["gain_accuracy"]["values"] == [30, 34, 29] and row["gain_accuracy"]["mean"] == pytest.approx(31.0)
    assert row["gain_accuracy"]["sd"] == pytest.approx(7 ** 0.5)  # deviations -1, 3, -2: 14 / 2
    assert greedy["gain_accuracy"]["values"] == [5, 3, 0] and "demonstrator_accuracy" not in greedy
    assert row["demonstrator_accuracy"]["values"] == [83.4] * 3
    assert agg["capabilities"]["avx512"]["seeds"] == [0] and agg["capabilities"]["avx512"]["pending"] == [1, 2]
    text = sw.write_outputs(agg, tmp_path, "memrl demo --seeds 0,1,2")
    assert text == (tmp_path / "seeds_results.md").read_text()
    assert json.loads((tmp_path / "seeds_results.json").read_text())["command"] == "memrl demo --seeds 0,1,2"
    lines = text.splitlines()
    assert lines[0] == "`memrl demo --seeds 0,1,2`"
    assert "ATEN_CPU_CAPABILITY=avx2: mean ± sd over training seeds 0, 1, 2 (n = 3)" in lines
    assert ("| 8 | 1x | 83.4 ± 0.0 | 62.0 ± 2.0 | 93.0 ± 3.0 | +31.0 ± 2.6 | 97.0 ± 2.0 | 99.7 ± 0.6 | "
            "+2.7 ± 2.5 |") in lines
    assert ("| 32 | 4x | 44.7 ± 0.0 | 52.0 ± 2.0 | 83.0 ± 3.0 | +31.0 ± 2.6 | 87.0 ± 2.0 | 89.7 ± 0.6 | "
            "+2.7 ± 2.5 |") in lines
    assert "ATEN_CPU_CAPABILITY=avx512: mean ± sd over training seeds 0 (n = 1; not finished: 1, 2)" in lines
    assert ("| 8 | 1x | 83.4 ± n/a | 70.0 ± n/a | 80.0 ± n/a | +10.0 ± n/a | 90.0 ± n/a | 90.0 ± n/a | "
            "+0.0 ± n/a |") in lines


def test_native_runs_are_labelled_with_what_torch_reported(tmp_path):
    runs = sw.plan("memagent", tmp_path, [0], ["native"], [])
    write_run(runs[0], "memagent", memagent_result(60, 90, 95, 100))
    marker = runs[0].out / sw.MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "reported_capability": "avx512"}))
    agg = sw.aggregate("memagent", runs)
    assert agg["capabilities"]["native"]["reported"] == ["avx512"]
    assert sw.markdown(agg).splitlines()[0] == ("ATEN_CPU_CAPABILITY unset (torch reported avx512): mean ± sd over "
                                                "training seeds 0 (n = 1)")


def test_sweep_options_without_seeds_are_refused(capsys):
    from memrl.cli import main

    assert main(["demo", "--out", "unused", "--jobs", "2"]) == 2
    assert capsys.readouterr().err.strip() == ("memrl demo: error: --jobs and --aggregate-only need --seeds or "
                                               "--cpu-capability")


def test_aggregate_refuses_runs_with_other_heldout_tasks(tmp_path):
    runs = sw.plan("memagent", tmp_path, [0, 1], ["avx2"], [])
    write_run(runs[0], "memagent", memagent_result(60, 90, 95, 100))
    write_run(runs[1], "memagent", memagent_result(60, 90, 95, 100, heldout="h1"))
    with pytest.raises(UserError, match=r"seed1: evaluated other held-out tasks than .*seed0; runs with different "
                                        r"evaluations cannot be aggregated$"):
        sw.aggregate("memagent", runs)


def one_layout(policies: dict, heldout: str = "h0", **entries) -> dict:
    """A results.json in the one layout: {policy: {decoding: {bucket: summary}}} as its summary rows (in that
    order), the held-out digest, and `entries` (facts, config ...)."""
    rows = [{"policy": p, "decoding": d, "bucket": b, **s} for p, by_mode in policies.items()
            for d, by_bucket in by_mode.items() for b, s in by_bucket.items()]
    return {"heldout_sha256": [heldout], "summary": rows, **entries}


def memact_result(sft_acc: float, rl_acc: float, sft_ctx: float, rl_ctx: float, budget: int) -> dict:
    def summary(acc: float, ctx: float) -> dict:
        return {"accuracy": acc, "accuracy_2q": acc + 10, "accuracy_3q": acc - 10, "mean_context_tokens": ctx,
                "peak_context_tokens": ctx + 20, "prunes_per_task": acc / 100}

    return one_layout({"sft": {d: {"all": summary(sft_acc, sft_ctx)} for d in ("greedy", "sampled")},
                       "rl": {d: {"all": summary(rl_acc, rl_ctx)} for d in ("greedy", "sampled")}},
                      facts={"budget": {"max_context_tokens": budget, "eval_tasks": 300}})


def test_memact_aggregate_by_hand(tmp_path):
    runs = sw.plan("memact", tmp_path, [0, 1], ["avx512"], [])
    for r, res in zip(runs, (memact_result(40, 90, 100, 80, 120), memact_result(50, 80, 110, 70, 124)),
                      strict=True):
        write_run(r, "memact", res)
    agg = sw.aggregate("memact", runs)
    g = agg["capabilities"]["avx512"]["cells"]["greedy"]["all"]
    assert g["gain_accuracy"]["values"] == [50, 30] and g["gain_mean_context_tokens"]["values"] == [-20, -40]
    lines = sw.markdown(agg).splitlines()
    assert lines[0] == "ATEN_CPU_CAPABILITY=avx512: mean ± sd over training seeds 0, 1 (n = 2)"
    # sd of two values a, b is |a - b| / sqrt(2): 10 -> 7.1, 20 -> 14.1, 0.1 -> 0.07, 4 -> 2.8
    assert "| cold start (SFT) | greedy | 45.0 ± 7.1 | 55.0 ± 7.1 | 35.0 ± 7.1 | 105.0 ± 7.1 | 125.0 ± 7.1 | " \
           "0.45 ± 0.07 |" in lines
    assert "| SFT + DCPO | sampled | 85.0 ± 7.1 | 95.0 ± 7.1 | 75.0 ± 7.1 | 75.0 ± 7.1 | 95.0 ± 7.1 | 0.85 ± 0.07 |" \
        in lines
    assert "| DCPO - SFT | greedy | +40.0 ± 14.1 | +40.0 ± 14.1 | +40.0 ± 14.1 | -30.0 ± 14.1 | -30.0 ± 14.1 | " \
           "+0.40 ± 0.14 |" in lines
    assert "Working-context budget (calibrated per run): 122.0 ± 2.8 tokens." in lines
    (runs[1].out / "results.json").write_text(json.dumps({**memact_result(50, 80, 110, 70, 124),
                                                          "heldout_sha256": ["h1"]}))
    with pytest.raises(UserError, match="evaluated other held-out tasks"):
        sw.aggregate("memact", runs)
    # a question count no task of a run has (None in its summary) leaves that run out of the cell
    res = memact_result(50, 80, 110, 70, 124)
    res["summary"][0]["accuracy_3q"] = None  # sft greedy
    (runs[1].out / "results.json").write_text(json.dumps(res))
    g = sw.aggregate("memact", runs)["capabilities"]["avx512"]["cells"]["greedy"]["all"]
    assert g["sft_accuracy_3q"]["values"] == [30] and g["rl_accuracy_3q"]["values"] == [80, 70]
    assert g["gain_accuracy_3q"]["values"] == [50]


def test_context_aggregate_by_hand(tmp_path):
    def summary(acc: float, peak: float) -> dict:
        return {"accuracy": acc, "peak_context_tokens": peak, "mean_context_tokens": peak / 2,
                "tokens_discarded": 100.0, "branches": 5.0, "summaries": 0.0, "stopped_by_budget": 0.0}

    runs = sw.plan("context", tmp_path, [0, 1], ["native"], ["method=fold"])
    for r, (sft, rl) in zip(runs, ((20.0, 60.0), (30.0, 50.0)), strict=True):
        write_run(r, "context", one_layout({"sft": {d: {"all": summary(sft, 400.0)} for d in ("greedy", "sampled")},
                                            "rl": {d: {"all": summary(rl, 440.0)} for d in ("greedy", "sampled")}},
                                           facts={"budget": {"max_context_tokens": 481, "eval_tasks": 200}}))
    agg = sw.aggregate("context", runs)
    g = agg["capabilities"]["native"]["cells"]["greedy"]["all"]
    assert g["gain_accuracy"]["values"] == [40.0, 20.0] and g["gain_peak_context_tokens"]["values"] == [40.0, 40.0]
    lines = sw.markdown(agg).splitlines()
    # sd of two values a, b is |a - b| / sqrt(2): 10 -> 7.1, 20 -> 14.1, 0 -> 0.0
    assert "| SFT + RL | greedy | 55.0 ± 7.1 | 440.0 ± 0.0 | 220.0 ± 0.0 | 100.0 ± 0.0 | 5.00 ± 0.00 | 0.00 ± 0.00 " \
           "| 0.0 ± 0.0 |" in lines
    assert "| RL - SFT | sampled | +30.0 ± 14.1 | +40.0 ± 0.0 | +20.0 ± 0.0 | +0.0 ± 0.0 | +0.00 ± 0.00 " \
           "| +0.00 ± 0.00 | +0.0 ± 0.0 |" in lines



def test_mem1_aggregate_by_hand(tmp_path):
    def by_k(acc: float, peak: float) -> dict:
        return {str(k): {"accuracy": acc, "peak_context_tokens": peak * k, "mean_context_tokens": peak,
                         "turns": k + 1.0} for k in (2, 16)}

    runs = sw.plan("mem1", tmp_path, [0, 1], ["native"], ["method=mem1"])
    for r, (sft, rl) in zip(runs, ((20.0, 60.0), (30.0, 50.0)), strict=True):
        write_run(r, "mem1", one_layout({"sft": {d: by_k(sft, 10.0) for d in ("greedy", "sampled")},
                                         "rl": {d: by_k(rl, 12.0) for d in ("greedy", "sampled")}},
                                        config={"eval": {"objectives": [2, 16]}}))
    agg = sw.aggregate("mem1", runs)
    g = agg["capabilities"]["native"]["cells"]["greedy"]["16"]
    assert g["rl_accuracy"]["values"] == [60.0, 50.0] and g["sft_peak_context_tokens"]["values"] == [160.0] * 2
    lines = sw.markdown(agg).splitlines()
    # sd of two values a, b is |a - b| / sqrt(2): 10 -> 7.1; peak 12 x 16 = 192; turns 16 + 1
    assert "| SFT + RL | greedy | 16 | 55.0 ± 7.1 | 192.0 ± 0.0 | 12.0 ± 0.0 | 17.0 ± 0.0 |" in lines
    assert "| cold start (SFT) | sampled | 2 | 25.0 ± 7.1 | 20.0 ± 0.0 | 10.0 ± 0.0 | 3.0 ± 0.0 |" in lines


def test_infmem_seeds_and_aggregate_by_hand(tmp_path):
    im = sw.base_seeds("infmem", ["method=memagent"])  # preset infmem_cpu: data.seed 1000; eval.seed 987654
    assert im == {"seed": 0, "sft.seed": 500, "train.data.seed": 1000, "train.trainer.seed": 0, "eval.seed": 987654}
    assert sw.seed_overrides("infmem", 2, im) == ["seed=2", "sft.seed=502", "train.data.seed=1002",
                                                  "train.trainer.seed=2"]
    with pytest.raises(ConfigError, match=r"^--seeds: training seed 1 makes sft.seed equal eval.seed \(501\)"):
        sw.plan("infmem", tmp_path, [0, 1], ["native"], ["eval.seed=501"])

    def summary(acc: float, calls: float) -> dict:
        return {"accuracy": acc, "model_calls": calls, "chunks_read": (calls - 1) / 2, "retrievals": 1.0,
                "stop_rate": 100.0}

    runs = sw.plan("infmem", tmp_path, [0, 1], ["native"], ["method=infmem"])
    for r, (sft, rl) in zip(runs, ((20.0, 60.0), (30.0, 50.0)), strict=True):
        write_run(r, "infmem", one_layout({p: {d: {str(n): summary(acc, calls) for n in (8, 128)}
                                               for d in ("greedy", "sampled")}
                                           for p, acc, calls in (("sft", sft, 5.0), ("rl", rl, 4.0))},
                                          method="infmem", facts={"lengths": [8, 128]}))
    agg = sw.aggregate("infmem", runs)
    row = agg["capabilities"]["native"]["cells"]["greedy"]["128"]
    assert row["gain_accuracy"]["values"] == [40.0, 20.0] and row["gain_model_calls"]["values"] == [-1.0, -1.0]
    lines = sw.markdown(agg).splitlines()
    # sd of two values a, b is |a - b| / sqrt(2): 10 -> 7.1, 20 -> 14.1; chunks read (4 - 1) / 2 = 1.5
    assert "| SFT + RL | sampled | 8 | 55.0 ± 7.1 | 4.00 ± 0.00 | 1.50 ± 0.00 | 1.00 ± 0.00 | 100.0 ± 0.0 |" in lines
    assert "| RL - SFT | greedy | 128 | +30.0 ± 14.1 | -1.00 ± 0.00 | -0.50 ± 0.00 | +0.00 ± 0.00 | +0.0 ± 0.0 |" in lines
    res = json.loads((runs[1].out / "results.json").read_text())
    (runs[1].out / "results.json").write_text(json.dumps({**res, "heldout_sha256": ["h1"]}))
    with pytest.raises(UserError, match="evaluated other held-out tasks"):
        sw.aggregate("infmem", runs)


# ---------------------------------------------------------------------------------------------- running

CHILD = """
import json, os, pathlib, sys
out = pathlib.Path(sys.argv[1])
with open(out.parent.parent / "calls.txt", "a") as f:
    f.write(out.parent.name + "/" + out.name + "\\n")
if os.environ.get("FAIL_SEED") and out.name == "seed" + os.environ["FAIL_SEED"]:
    sys.exit(3)
(out / "results.json").write_text(json.dumps({"cap": os.environ["ATEN_CPU_CAPABILITY"], "files": sorted(
    p.name for p in out.iterdir())}))
"""


@pytest.fixture
def stand_in(monkeypatch):
    """The runs' command replaced by a seconds-long script that records its environment; the probe by an echo."""
    monkeypatch.setattr(sw, "run_command", lambda agent, run: [sys.executable, "-c", CHILD, str(run.out)])
    monkeypatch.setattr(sw, "probe_capability", lambda cap: cap)


def calls(root: Path) -> list[str]:
    return (root / "calls.txt").read_text().splitlines() if (root / "calls.txt").exists() else []


def test_each_run_gets_its_capability_and_a_finished_run_is_not_redone(tmp_path, stand_in):
    runs = sw.plan("memagent", tmp_path, [0, 1], ["avx2", "avx512"], ["threads=1"])
    status = sw.run_all("memagent", runs, jobs=2, log=lambda _: None)
    assert status == {r.out: "done" for r in runs}
    assert sorted(calls(tmp_path)) == ["avx2/seed0", "avx2/seed1", "avx512/seed0", "avx512/seed1"]
    for r in runs:
        res = json.loads((r.out / "results.json").read_text())
        assert res == {"cap": r.capability, "files": ["log.txt", sw.MARKER]}
        marker = json.loads((r.out / sw.MARKER).read_text())
        assert marker["reported_capability"] == r.capability and marker["overrides"] == list(r.overrides)
    # a second sweep starts nothing; a run removed is run again alone
    (runs[2].out / "results.json").unlink()
    (runs[2].out / "stale.txt").write_text("from the interrupted run")
    status = sw.run_all("memagent", runs, log=lambda _: None)
    assert status == {**{r.out: "skipped" for r in runs}, runs[2].out: "done"}
    assert calls(tmp_path)[4:] == ["avx2/seed1"]
    assert json.loads((runs[2].out / "results.json").read_text())["files"] == ["log.txt", sw.MARKER]


def test_a_failed_run_is_reported_and_the_others_still_run(tmp_path, stand_in, monkeypatch):
    monkeypatch.setenv("FAIL_SEED", "0")
    runs = sw.plan("memagent", tmp_path, [0, 1], ["avx2"], [])
    status = sw.run_all("memagent", runs, log=lambda _: None)
    assert status == {runs[0].out: "failed (exit 3)", runs[1].out: "done"}
    assert sw.run_state("memagent", runs[0]) == "partial"


def test_run_state_refuses_directories_of_other_runs(tmp_path, stand_in):
    runs = sw.plan("memagent", tmp_path, [0], ["avx2"], [])
    assert sw.run_state("memagent", runs[0]) == "new"
    runs[0].out.mkdir(parents=True)
    assert sw.run_state("memagent", runs[0]) == "new"  # empty
    (runs[0].out / "x.txt").write_text("")
    with pytest.raises(UserError, match=r"seed0: not empty and has no sweep_run.json; not a run of this sweep"):
        sw.run_all("memagent", runs, log=lambda _: None)
    (runs[0].out / sw.MARKER).write_text(json.dumps(sw.marker_of("memagent", runs[0])))
    other = sw.plan("memagent", tmp_path, [0], ["avx2"], ["threads=1"])
    with pytest.raises(UserError, match=r"sweep_run.json: overrides is \["):
        sw.run_all("memagent", other, log=lambda _: None)
    with pytest.raises(UserError, match=r"sweep_run.json: agent is 'memagent', this sweep's run has 'memact'"):
        sw.run_state("memact", other[0])


def test_a_capability_torch_does_not_report_stops_the_sweep_before_any_run(tmp_path, stand_in, monkeypatch):
    monkeypatch.setattr(sw, "probe_capability", lambda cap: "avx2")
    runs = sw.plan("memagent", tmp_path, [0], ["avx2", "avx512"], [])
    with pytest.raises(ConfigError, match=r"^--cpu-capability avx512: torch reports 'avx2' with "
                                          r"ATEN_CPU_CAPABILITY=avx512 on this machine"):
        sw.run_all("memagent", runs, log=lambda _: None)
    assert calls(tmp_path) == []


def test_child_env_and_the_real_probe():
    env = sw.child_env("avx2", {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx512"})
    assert env == {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2"}
    assert sw.child_env("native", {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx512"}) == {"PATH": "/bin"}
    assert sw.probe_capability("default") == "default"


def test_base_seeds_read_a_named_variant_as_the_demo_does(monkeypatch):
    from memrl.recipes import memact

    # a variant standing for seed overrides: the sweep must shift from the variant's values, as `memrl demo
    # variant=...` would run them (sft.seed 40 and data.seed 70 here, not the defaults 500 and 7)
    monkeypatch.setitem(memact.VARIANTS, "probe", ("sft.seed=40", "train.data.seed=70"))
    mc = sw.base_seeds("memact", ["variant=probe"])
    assert (mc["sft.seed"], mc["train.data.seed"]) == (40, 70)
    assert sw.seed_overrides("memact", 1, mc)[1:4] == ["sft.seed=41", "rl_task_seed=101", "train.data.seed=71"]


def test_run_tables_write_mean_se_through_the_one_cell():
    """results.md's accuracy ± SE (RunTable's ACCURACY_SE, the look-back grid's mean_se) is memrl.eval.stats.cell
    of the two recorded numbers: 62.04 ± 1.25 -> "62.0 ± 1.2" (1.25 rounds half to even), no second "+-" text."""
    s = {"accuracy": 62.04, "accuracy_se": 1.25, "se": 0.35, "turns": 3.0}
    assert tb.ACCURACY_SE(s) == cell(stats.recorded(62.04, 1.25)) == "62.0 ± 1.2"
    assert tb.mean_se("accuracy", "se", 2)(s) == "62.04 ± 0.35"
    t = tb.RunTable((("accuracy", tb.ACCURACY_SE), ("turns", "{turns:.1f}")), (("SFT", "sft"),))
    row = {"policy": "sft", "decoding": "greedy", "bucket": "all", **s}
    assert t.render({"summary": [row]}).splitlines()[-1] == "| SFT | greedy | 62.0 ± 1.2 | 3.0 |"


def test_run_tables_render_summary_rows_decoding_major_with_defaults_for_none():
    """A run table's rows are each policy's summary rows, decodings then buckets in first-seen order (an
    evaluation that ran each bucket's greedy then sampled still shows all greedy rows first); a field a row
    holds as None shows the table's default; title and notes read results.json's entries and its facts."""
    rows = [{"policy": p, "decoding": d, "bucket": b, "acc": a, "q2": None if b == "1" else 5.0}
            for p, a in (("rl", 2.0), ("sft", 1.0)) for b in ("1", "2") for d in ("greedy", "sampled")]
    t = tb.RunTable((("acc", "{acc:.1f}"), ("2q", "{q2:.1f}")), (("SFT", "sft"), ("RL", "rl")), bucket="k",
                    defaults={"q2": 0.0}, title="method {method}, budget {budget[tokens]}", notes=("n {n}",),
                    values=lambda res: {"n": len(res["summary"])})
    text = t.render({"method": "m", "facts": {"budget": {"tokens": 96}}, "summary": rows})
    assert text.splitlines() == [
        "method m, budget 96", "", "| policy | decoding | k | acc | 2q |", "|---|---|---:|---:|---:|",
        "| SFT | greedy | 1 | 1.0 | 0.0 |", "| SFT | greedy | 2 | 1.0 | 5.0 |", "| SFT | sampled | 1 | 1.0 | 0.0 |",
        "| SFT | sampled | 2 | 1.0 | 5.0 |", "| RL | greedy | 1 | 2.0 | 0.0 |", "| RL | greedy | 2 | 2.0 | 5.0 |",
        "| RL | sampled | 1 | 2.0 | 0.0 |", "| RL | sampled | 2 | 2.0 | 5.0 |", "", "n 8"]
