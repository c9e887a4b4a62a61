"""`memrl demo --agent context` end to end at toy sizes (tiny model, a few SFT / RL steps) for fold and
summarize: every stage ran and results.json holds hand-derivable counts."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main

pytestmark = pytest.mark.slow

TOY = ["sft.num_tasks=12", "sft.epochs=1", "sft.batch_rows=8", "sft.copy_warmup_steps=3", "eval.num_tasks=4",
       "rl_tasks=8", "threads=1", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
       "model.num_kv_heads=1", "train.trainer.steps=2", "train.trainer.batch_size=2", "train.algorithm.n=2",
       "train.trainer.progress=false"]


@pytest.mark.parametrize("method, workflow, algorithm, rows_per_task, branches, summaries, scripted_acc", [
    # 5 facts per task (the default task): the flawless folding agent opens one branch per fact, so each
    # trajectory is 5 branch rows + the main row = 6
    ("fold", "fold", "foldgrpo", 6, 5, 0, 100.0),
    # the summary agent at summary_fraction 0.7 of the budget calibrated on fold: 2 summaries per task
    # (measured on 100 held-out tasks, module docstring of memrl.demos.context), one row per part = 3
    ("summarize", "summarize", "grpo", 3, 0, 2, 100.0),
    # the unmanaged agent: no window shift, so one row; the budget stops it before its last fact (accuracy 0)
    ("react", "sliding_window", "grpo", 1, 0, 0, 0.0),
])
def test_context_demo_runs_every_stage(tmp_path, capsys, method, workflow, algorithm, rows_per_task, branches,
                                       summaries, scripted_acc):
    out = tmp_path / method
    rc = main(["demo", "--agent", "context", "--out", str(out), f"method={method}", *TOY])
    assert rc == 0
    for name in ("results.md", "results.json", "demo_config.yaml", "sft/config.json", "copy_warmup/metrics.jsonl",
                 "rl/metrics.jsonl", "rl/checkpoints/step_000002/model.safetensors", "data/train_tasks.jsonl",
                 "data/heldout_tasks.jsonl", "init/config.json"):
        assert (out / name).is_file(), name
    res = json.loads((out / "results.json").read_text())
    assert (out / "results.md").read_text() in capsys.readouterr().out
    assert res["method"] == method and res["workflow"]["name"] == workflow and res["algorithm"] == algorithm
    assert res["process_rewards"] == (["unfolded", "scope", "failure"] if method == "fold" else [])
    budget = res["budget"]["max_context_tokens"]
    assert res["workflow"]["max_context_tokens"] == budget and res["budget"]["eval_tasks"] == 4
    assert len(res["copy_warmup_losses"]) == 3 and len(res["rl_history"]["reward/mean"]) == 2
    d = res["demonstrator"]
    assert d["rows_per_task"] == [rows_per_task] * 12 and d["rows"] == 12 * rows_per_task
    assert d["branches_per_task"] == [branches] * 12 and d["summaries_per_task"] == [summaries] * 12
    # 12 tasks x rows_per_task rows in batches of 8, one epoch
    assert len(res["sft_losses"]) == -(-12 * rows_per_task // 8)
    s = res["scripted"]["greedy"]
    assert s["accuracy"] == scripted_acc and s["stopped_by_budget"] == 100.0 - scripted_acc and s["num_tasks"] == 12.0
    if method == "fold":
        assert s["peak_context_tokens"] <= budget  # the budget is the largest fold peak on these tasks
    ref = res["reference"]["react_unbounded"]
    assert ref["accuracy"] == 100.0 and ref["peak_context_tokens"] > budget  # the unmanaged agent passes it
    for policy in ("sft", "rl"):
        for mode in ("greedy", "sampled"):
            r = res[policy][mode]
            assert r["num_tasks"] == 4.0 and (r["accuracy"] / 25).is_integer()  # 4 tasks: steps of 25 points
            assert r["peak_context_tokens"] <= budget


def test_context_demo_refuses_a_flaw_for_the_search_agent(tmp_path, capsys):
    rc = main(["demo", "--agent", "context", "--out", str(tmp_path / "d"), "method=react", "sft.late_prob=0.2"])
    assert rc != 0
    assert "sft.late_prob must be 0 for method=react" in capsys.readouterr().err
    assert not (tmp_path / "d" / "data").exists()


def test_context_demo_refuses_an_unknown_method(tmp_path, capsys):
    rc = main(["demo", "--agent", "context", "--out", str(tmp_path / "d"), "method=folding"])
    assert rc != 0
    assert "method" in capsys.readouterr().err


def test_each_method_sets_its_workflow_and_estimator(tmp_path):
    from memrl.demos.context import ARMS, load_configs

    assert list(ARMS) == ["react", "window", "summarize", "fold", "fold_no_process"]
    want = {  # method -> (workflow section keys the arm sets, algorithm, process rewards, norm_by_std)
        "react": ({"name": "sliding_window", "window_turns": 0}, "grpo", None, True),
        "window": ({"name": "sliding_window", "window_turns": 2}, "grpo", None, True),
        "summarize": ({"name": "summarize", "summary_fraction": 0.7}, "grpo", None, True),
        "fold": ({"name": "fold"}, "foldgrpo", ["unfolded", "scope", "failure"], None),
        "fold_no_process": ({"name": "fold"}, "foldgrpo", [], None),
    }
    for method, (section, algo, process, norm) in want.items():
        _, tcfg, _, arm = load_configs([f"method={method}"], tmp_path / method)
        assert {k: tcfg.workflow[k] for k in section} == section and tcfg.algorithm.name == algo
        if process is not None:
            assert tcfg.algorithm.foldgrpo.process_rewards == process
        if norm is not None:
            assert tcfg.algorithm.grpo.norm_by_std is norm
        assert tcfg.workflow["retriever_scope"] == "task" and tcfg.workflow["max_assistant_turns"] == 20
    # an explicit workflow key wins over the arm's
    _, tcfg, _, _ = load_configs(["method=window", "workflow.window_turns=3"], tmp_path / "w3")
    assert tcfg.workflow["window_turns"] == 3
