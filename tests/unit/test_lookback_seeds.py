"""The multi-seed table of benchmarks/lookback_compare.py: hand-made per-seed numbers -> exact mean ± sd,
paired gaps and goal checks."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "lookback_compare.py"
_spec = importlib.util.spec_from_file_location("lookback_compare", _PATH)
lc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lc)


def cell(em8: float, em16: float, rr: float = 0.0, hr: float | None = None) -> dict:
    return {"greedy": {"by_length": {"8": {"em": em8, "se": 5.0}, "16": {"em": em16, "se": 7.0}},
                       "recall_rate": rr, "callback_hit_rate": hr}}


TABLES = {
    0: {"rl_rememr1": cell(60, 50, 0.1, 0.5), "rl_rememr1_norecall": cell(40, 45), "rl_memagent": cell(50, 40)},
    1: {"rl_rememr1": cell(70, 50, 0.2, 0.7), "rl_rememr1_norecall": cell(40, 50), "rl_memagent": cell(50, 40)},
    2: {"rl_rememr1": cell(80, 80, 0.3, None), "rl_rememr1_norecall": cell(40, 55), "rl_memagent": cell(50, 40)},
}


def test_mean_sd_gaps_and_goals_over_seeds():
    agg = lc.aggregate(TABLES, [8, 16])
    rl = agg["runs"]["rl_rememr1"]["greedy"]
    assert rl["em"]["8"]["mean"] == 70.0 and rl["em"]["8"]["sd"] == 10.0  # 60, 70, 80
    assert rl["em"]["16"]["mean"] == 60.0 and rl["em"]["16"]["sd"] == pytest.approx(math.sqrt(300))  # 50, 50, 80
    assert rl["se_tasks"] == {"8": 5.0, "16": 7.0}
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
    md = lc.aggregate_markdown(agg, [8, 16], "cmd")
    assert "| rl_rememr1 | 70.0 ± 10.0 | 60.0 ± 17.3 | 0.200 ± 0.100 | 0.600 ± 0.141 |" in md
    assert "| rl_memagent | 50.0 ± 0.0 | 40.0 ± 0.0 | - | - |" in md
    assert "| rl_rememr1 - rl_rememr1_norecall | +30.0 ± 10.0 | +10.0 ± 13.2 |" in md
    assert "| RL ReMemR1 - RL MemAgent >= 10 at N=16 | +20.0 | met |" in md


def test_a_missed_goal_says_what_was_reached():
    tables = {s: {"rl_rememr1": cell(50, 30, 0.0, None), "rl_rememr1_norecall": cell(50, 30),
                  "rl_memagent": cell(50, 35)} for s in (0, 1)}
    tables[0]["oracle_rememr1"] = cell(100, 100, 0.06, 1.0)  # the oracles: the first seed only
    agg = lc.aggregate(tables, [8, 16])
    goals = agg["goals"]["greedy"]
    assert goals["recall rate > 0"] == (0.0, False)
    assert goals["callback hit rate > 0.5"] == (None, False)  # no seed recalled
    assert goals["RL ReMemR1 - RL MemAgent >= 10 at N=16"] == (-5.0, False)
    md = lc.aggregate_markdown(agg, [8, 16])
    assert "| callback hit rate > 0.5 | n/a | MISSED |" in md
    assert "| oracle_rememr1 (n = 1) | 100.0 ± n/a | 100.0 ± n/a | 0.060 ± n/a | 1.000 ± n/a |" in md
    assert "| RL ReMemR1 - RL MemAgent >= 10 at N=16 | -5.0 | MISSED |" in md


def test_training_task_seeds_never_hit_the_eval_seeds():
    assert lc.task_seeds(0, 1000, [2, 4]) == {"train": 1, "sft": 2}  # the one-seed benchmark's
    assert lc.task_seeds(2, 1000, [2, 4]) == {"train": 5, "sft": 6}
    with pytest.raises(SystemExit, match="eval task seed"):
        lc.task_seeds(1, 2, [2, 4])  # sft seed 4 = eval seed 2 + 2


def test_a_seed_directory_refuses_another_recipe(tmp_path):
    import argparse

    args = argparse.Namespace(**{k: 0 for k in lc.RECIPE_KEYS})
    lc.check_recipe(tmp_path, args)  # first run: recorded
    lc.check_recipe(tmp_path, args)  # resume with the same options: fine
    args.rl_steps = 40
    with pytest.raises(SystemExit, match="recipe.json: rl_steps is 0, this run has 40"):
        lc.check_recipe(tmp_path, args)
