"""The look-back comparison over seeds: hand-made per-seed results.json -> the one aggregation (memrl.recipes.seeds.
cells of the runs' summary rows) -> benchmarks/lookback_compare.py's exact mean ± sd, paired
gaps and goal checks; the task streams never hit the held-out seeds."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from memrl.config import ConfigError
from memrl.recipes.lookback import RECIPE, LookbackConfig, streams
from memrl.recipes.pipeline import check_task_seeds
from memrl.recipes.seeds import cells, run_rows

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "lookback_compare.py"
_spec = importlib.util.spec_from_file_location("lookback_compare", _PATH)
lc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lc)


def by_length(policy: str, em8: float, em16: float, rr: float = 0.0, hr: float | None = None) -> list[dict]:
    """A policy's greedy summary rows: lengths 8 and 16, and pooled."""
    s = {"recall_rate": rr, "callback_hit_rate": hr}
    return [{"policy": policy, "decoding": "greedy", "bucket": b, "accuracy": a, **s}
            for b, a in (("8", em8), ("16", em16), ("all", (em8 + em16) / 2))]


def result(rl: tuple, norecall: tuple | None = None, oracle: tuple | None = None) -> dict:
    """A results.json in the one layout: its summary rows."""
    return {"summary": [*(by_length("oracle", *oracle) if oracle else []), *by_length("sft", 0, 0),
                        *by_length("rl", *rl), *(by_length("rl_norecall", *norecall) if norecall else [])]}


def entry(results: list[dict]) -> dict:
    return {"seeds": list(range(len(results))), "buckets": ["8", "16", "all"],
            "cells": cells(run_rows(RECIPE, [(Path(f"seed{k}"), r) for k, r in enumerate(results)]))}


REMEMR1 = [result((60, 50, 0.1, 0.5), (40, 45)), result((70, 50, 0.2, 0.7), (40, 50)),
           result((80, 80, 0.3, None), (40, 55))]
MEMAGENT = [result((50, 40))] * 3


def test_mean_sd_gaps_and_goals_over_seeds():
    rem = entry(REMEMR1)
    # a hit rate of None (no recalls) counts in no cell: the SFT policy never recalled, so no SFT rate or gain
    assert "sft_callback_hit_rate" not in rem["cells"]["greedy"]["all"]
    assert "gain_callback_hit_rate" not in rem["cells"]["greedy"]["all"]
    assert rem["cells"]["greedy"]["all"]["rl_callback_hit_rate"]["values"] == [0.5, 0.7]  # seed 2: None
    agg = lc.compare({"memagent": entry(MEMAGENT), "rememr1": rem}, ["8", "16"])
    rl = agg["runs"]["rl_rememr1"]["greedy"]
    assert rl["em"]["8"]["mean"] == 70.0 and rl["em"]["8"]["sd"] == 10.0  # 60, 70, 80
    assert rl["em"]["16"]["mean"] == 60.0 and rl["em"]["16"]["sd"] == pytest.approx(math.sqrt(300))  # 50, 50, 80
    assert rl["recall_rate"]["mean"] == pytest.approx(0.2) and rl["recall_rate"]["sd"] == pytest.approx(0.1)
    # the hit rate averages the seeds that recalled (seed 2 has no recalls: None)
    assert rl["callback_hit_rate"]["n"] == 2 and rl["callback_hit_rate"]["mean"] == pytest.approx(0.6)
    assert rl["callback_hit_rate"]["sd"] == pytest.approx(math.sqrt(0.02))
    g = agg["gaps"]["greedy"]
    assert g["ablation_drop_N8"]["values"] == [20, 30, 40] and g["ablation_drop_N8"]["mean"] == 30.0
    assert g["ablation_drop_N16"]["values"] == [5, 0, 25] and g["ablation_drop_N16"]["mean"] == 10.0
    assert g["ablation_drop_N16"]["sd"] == pytest.approx(math.sqrt(175))
    assert g["rememr1_minus_memagent_N16"]["values"] == [10, 10, 40]
    goals = agg["goals"]["greedy"]
    assert goals["recall rate > 0"] == (pytest.approx(0.2), True)
    assert goals["callback hit rate > 0.5"] == (pytest.approx(0.6), True)
    assert goals["recall off drops accuracy >= 10 at N=8"] == (30.0, True)
    assert goals["recall off drops accuracy >= 10 at N=16"] == (10.0, True)  # exactly 10 is met
    assert goals["RL ReMemR1 - RL MemAgent >= 10 at N=16"] == (20.0, True)
    assert "sampled" not in agg["runs"]["rl_rememr1"] and agg["goals"]["sampled"] == {}
    md = lc.markdown(agg, ["8", "16"], "cmd")
    assert "| rl_rememr1 | 70.0 ± 10.0 | 60.0 ± 17.3 | 0.200 ± 0.100 | 0.600 ± 0.141 |" in md
    assert "| rl_memagent | 50.0 ± 0.0 | 40.0 ± 0.0 | - | - |" in md
    assert "| sft_rememr1 | 0.0 ± 0.0 | 0.0 ± 0.0 | 0.000 ± 0.000 | n/a |" in md
    assert "| rl_rememr1 - rl_rememr1_norecall | +30.0 ± 10.0 | +10.0 ± 13.2 |" in md
    assert "| RL ReMemR1 - RL MemAgent >= 10 at N=16 | +20.0 | met |" in md


def test_a_missed_goal_says_what_was_reached():
    rem = [result((50, 30, 0.0, None), (50, 30), oracle=(100, 100, 0.06, 1.0)), result((50, 30, 0.0, None), (50, 30))]
    agg = lc.compare({"memagent": entry([result((50, 35))] * 2), "rememr1": entry(rem)}, ["8", "16"])
    goals = agg["goals"]["greedy"]
    assert goals["recall rate > 0"] == (0.0, False)
    assert goals["callback hit rate > 0.5"] == (None, False)  # no seed recalled
    assert goals["RL ReMemR1 - RL MemAgent >= 10 at N=16"] == (-5.0, False)
    md = lc.markdown(agg, ["8", "16"])
    assert "| callback hit rate > 0.5 | n/a | MISSED |" in md
    assert "| oracle_rememr1 (n = 1) | 100.0 ± n/a | 100.0 ± n/a | 0.060 ± n/a | 1.000 ± n/a |" in md
    assert "| RL ReMemR1 - RL MemAgent >= 10 at N=16 | -5.0 | MISSED |" in md


def test_the_arms_must_have_finished_the_same_seeds():
    with pytest.raises(SystemExit, match="different seeds"):
        lc.compare({"memagent": entry(MEMAGENT[:2]), "rememr1": entry(REMEMR1)}, ["8", "16"])


def test_training_task_seeds_never_hit_the_eval_seeds():
    assert streams(LookbackConfig()) == {"rl": 1, "sft": 2}  # the old benchmark's seed 0
    assert streams(LookbackConfig(seed=2)) == {"rl": 5, "sft": 6}  # its 1 + 2k, 2 + 2k
    RECIPE.check(LookbackConfig(seed=1), [])
    check_task_seeds(RECIPE, LookbackConfig(seed=1))
    bad = LookbackConfig(seed=1)
    bad.eval.seed, bad.eval.lengths = 2, [2, 4]
    with pytest.raises(ConfigError, match="the sft task seed 4 is a held-out task seed"):
        check_task_seeds(RECIPE, bad)  # sft seed 2 + 2 = eval seed 2 + length 2
    with pytest.raises(ConfigError, match="not overridable"):
        RECIPE.check(LookbackConfig(), ["workflow.recall=false"])


def test_each_arm_trains_from_its_own_preset():
    assert LookbackConfig(method="memagent").train_preset == "lookback_memagent_cpu"
    assert LookbackConfig().train_preset == "lookback_rememr1_cpu"
    assert LookbackConfig(method="memagent", train_preset="x").train_preset == "x"
