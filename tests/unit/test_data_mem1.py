"""MEM1's multi-objective rows (the published generator's layout) read as memrl Tasks that the mem1 workflow
and its reward use as they are."""

from __future__ import annotations

import pytest

from memrl.data.errors import DataError
from memrl.data.files import write_parquet
from memrl.data.io import detect_kind, load_tasks
from memrl.types import Score, Trajectory
from memrl.workflows.mem1 import reward

ROW = {
    "data_source": "hotpotqa",
    "prompt": [{"role": "user", "content": "Instructions... Questions: who? ; where?"}],
    "ability": "fact-reasoning",
    "reward_model": {"style": "rule", "ground_truth": {"target": [["Ann", "Anne"], ["Oslo"]]}},
    "extra_info": {"split": "train", "indices": [6, 7]},
}


def test_mem1_parquet_rows_become_multi_objective_tasks(tmp_path):
    path = tmp_path / "train.parquet"
    write_parquet(path, [ROW, {**ROW, "extra_info": {"split": "train", "indices": [8, 9]}}])
    assert detect_kind(path) == "mem1"
    tasks = load_tasks(path)
    t = tasks[0]
    assert (t.task_id, t.question, t.context, t.answers) == (
        "hotpotqa-6-7", "Instructions... Questions: who? ; where?", "", ["Ann", "Oslo"])
    assert t.meta["sub_answers"] == [["Ann", "Anne"], ["Oslo"]]
    assert tasks[1].task_id == "hotpotqa-8-9"
    # the mem1 reward scores objective i against aliases i: "anne" matches the second alias of objective 1
    traj = Trajectory(t.task_id, "x", [], final_answer="anne; Bergen", info={"reward_scale": "sum"})
    s = reward(t, traj)
    assert isinstance(s, Score) and s.reward == 1.0 and s.metrics["multiq_correct"] == 1.0


def test_bad_target_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    bad = {**ROW, "reward_model": {"style": "rule", "ground_truth": {"target": [["Ann"], []]}}}
    path.write_text(__import__("json").dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"row 0.*reward_model\.ground_truth\.target\[1\]"):
        load_tasks(path, "mem1")
