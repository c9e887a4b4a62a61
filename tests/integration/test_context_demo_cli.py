"""`memrl demo --agent context` end to end at toy sizes (tiny model, a few SFT / RL steps) for fold and
summarize: every stage ran and results.json holds hand-derivable counts."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main
from memrl.eval.fields import one
from memrl.recipes.pipeline import load_recipe

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
    # (measured on 100 held-out tasks, module docstring of memrl.recipes.context), one row per part = 3
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
    train, facts = res["train"], res["facts"]
    assert res["method"] == method and train["workflow"]["name"] == workflow
    assert train["algorithm"]["name"] == algorithm
    assert facts["process_rewards"] == (["unfolded", "scope", "failure"] if method == "fold" else [])
    budget = facts["budget"]["max_context_tokens"]
    assert train["workflow"]["max_context_tokens"] == budget and facts["budget"]["eval_tasks"] == 4
    assert len(res["losses"]["copy_warmup"]) == 3 and len(res["history"]) == 2
    d = facts["cold_start"]
    assert d["rows_per_task"] == [rows_per_task] * 12 and d["rows"] == d["rows_trained"] == 12 * rows_per_task
    assert d["branches_per_task"] == [branches] * 12 and d["summaries_per_task"] == [summaries] * 12
    # 12 tasks x rows_per_task rows in batches of 8, one epoch
    assert len(res["losses"]["sft"]) == -(-12 * rows_per_task // 8)
    assert [(r["policy"], r["decoding"], r["bucket"]) for r in res["summary"]] == [
        ("react_unbounded", "greedy", "all"), ("scripted", "greedy", "all"), ("sft", "greedy", "all"),
        ("sft", "sampled", "all"), ("rl", "greedy", "all"), ("rl", "sampled", "all")]
    s = one(res["summary"], policy="scripted")
    assert s["accuracy"] == scripted_acc and s["stopped_by_budget"] == 100.0 - scripted_acc and s["num_tasks"] == 12.0
    if method == "fold":
        assert s["peak_context_tokens"] <= budget  # the budget is the largest fold peak on these tasks
    ref = one(res["summary"], policy="react_unbounded")
    assert ref["accuracy"] == 100.0 and ref["peak_context_tokens"] > budget  # the unmanaged agent passes it
    for policy in ("sft", "rl"):
        for mode in ("greedy", "sampled"):
            r = one(res["summary"], policy=policy, decoding=mode)
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
    from memrl.recipes.context import ARMS, RECIPE

    assert list(ARMS) == ["react", "window", "summarize", "fold", "fold_no_process"]
    want = {  # method -> (workflow section keys the arm sets, algorithm, process rewards, norm_by_std)
        "react": ({"name": "sliding_window", "window_turns": 0}, "grpo", None, True),
        "window": ({"name": "sliding_window", "window_turns": 2}, "grpo", None, True),
        "summarize": ({"name": "summarize", "summary_fraction": 0.7}, "grpo", None, True),
        "fold": ({"name": "fold"}, "foldgrpo", ["unfolded", "scope", "failure"], None),
        "fold_no_process": ({"name": "fold"}, "foldgrpo", [], None),
    }
    for method, (section, algo, process, norm) in want.items():
        tcfg = load_recipe(RECIPE, [f"method={method}"], tmp_path / method).tcfg
        assert {k: tcfg.workflow[k] for k in section} == section and tcfg.algorithm.name == algo
        if process is not None:
            assert tcfg.algorithm.foldgrpo.process_rewards == process
        if norm is not None:
            assert tcfg.algorithm.grpo.norm_by_std is norm
        assert tcfg.workflow["retriever_scope"] == "task" and tcfg.workflow["max_assistant_turns"] == 20
    # an explicit workflow key wins over the arm's
    tcfg = load_recipe(RECIPE, ["method=window", "workflow.window_turns=3"], tmp_path / "w3").tcfg
    assert tcfg.workflow["window_turns"] == 3


def test_fold_no_process_reuses_folds_cold_start_and_window_its_warmup(tmp_path, capsys):
    """sft_from: the ablation trains from the very model fold's cold start saved (and reports fold's SFT
    evaluation, which it does not repeat); warmup_from: another method of the same seed starts its cold start
    from the same copy-warmed weights. Both refuse a run whose cold start / warm-up differs."""
    fold, ablation, window = tmp_path / "fold", tmp_path / "fold_np", tmp_path / "window"
    assert main(["demo", "--agent", "context", "--out", str(fold), "method=fold", *TOY]) == 0
    capsys.readouterr()
    assert main(["demo", "--agent", "context", "--out", str(ablation), "method=fold_no_process",
                 f"sft_from={fold}", *TOY]) == 0
    assert f"the cold start of {fold}" in capsys.readouterr().out
    a, f = (json.loads((d / "results.json").read_text()) for d in (ablation, fold))
    assert (ablation / "sft" / "model.safetensors").read_bytes() == (fold / "sft" / "model.safetensors").read_bytes()
    assert a["losses"] == f["losses"] and a["heldout_sha256"] == f["heldout_sha256"]
    for key in ("cold_start", "budget"):
        assert a["facts"][key] == f["facts"][key], key
    # fold's scripted, unbounded and SFT rows (its eval_rows files, copied), not evaluated again
    assert a["summary"][:4] == f["summary"][:4] and [r["policy"] for r in a["summary"][:4]] == [
        "react_unbounded", "scripted", "sft", "sft"]
    for policy in ("react_unbounded", "scripted", "sft"):
        rows = f"eval_rows/{policy}.jsonl"
        assert (ablation / rows).read_bytes() == (fold / rows).read_bytes(), rows
    assert a["config"]["sft_from"] == str(fold) and f["config"]["sft_from"] == ""
    assert a["facts"]["process_rewards"] == [] and f["facts"]["process_rewards"] == ["unfolded", "scope", "failure"]
    assert len(a["history"]) == 2
    assert "sft_s" not in a["timings"] and "sft_s" in f["timings"]

    assert main(["demo", "--agent", "context", "--out", str(window), "method=window", f"warmup_from={fold}",
                 *TOY, "sft.max_rows=10"]) == 0
    assert f"copy warm-up: the 3 steps of {fold}" in capsys.readouterr().out
    w = json.loads((window / "results.json").read_text())
    assert w["losses"]["copy_warmup"] == f["losses"]["copy_warmup"]
    assert ((window / "copy_warmup" / "model.safetensors").read_bytes()
            == (fold / "copy_warmup" / "model.safetensors").read_bytes())
    # sft.max_rows=10 trains the first 10 of its rows: ceil(10 / 8) = 2 steps of one epoch
    wd, fd = w["facts"]["cold_start"], f["facts"]["cold_start"]
    assert wd["rows_trained"] == 10 and len(w["losses"]["sft"]) == 2
    assert wd["rows"] == sum(wd["rows_per_task"]) > 10
    # its own cold start (the search agent through the window), not fold's 6 rows per task
    assert w["train"]["workflow"]["name"] == "sliding_window" and wd["rows_per_task"] != fd["rows_per_task"]
    assert w["config"]["sft_from"] == ""

    # a run written before a field existed counts as having its default: drop sft.max_rows from fold's config
    cfg_path = fold / "demo_config.yaml"
    text = cfg_path.read_text()
    cfg_path.write_text("\n".join(line for line in text.splitlines() if "max_rows" not in line) + "\n")
    assert main(["demo", "--agent", "context", "--out", str(tmp_path / "np2"), "method=fold_no_process",
                 f"sft_from={fold}", *TOY]) == 0
    capsys.readouterr()

    # refusals, in one line before any training
    cases = [(["method=window", f"sft_from={fold}"], "has another cold start than method=window"),
             (["method=fold_no_process", f"sft_from={fold}", "sft.epochs=2"], "its sft is"),
             (["method=fold_no_process", f"sft_from={tmp_path / 'none'}"], "no finished context demo there"),
             (["method=react", f"warmup_from={fold}", "seed=1"], "its init/model.safetensors differs"),
             (["method=react", f"warmup_from={fold}", "sft.lr=0.002"], "its sft.lr is 0.001, this run's is 0.002")]
    for i, (args, msg) in enumerate(cases):
        assert main(["demo", "--agent", "context", "--out", str(tmp_path / f"bad{i}"), *TOY, *args]) != 0
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, (args, err)


def test_a_seed_sweep_maps_a_reused_run_to_its_own_seed(tmp_path):
    from memrl.recipes.seeds import plan

    runs = plan("context", tmp_path / "np", [0, 2], ["native"],
                ["method=fold_no_process", f"sft_from={tmp_path / 'fold'}", f"warmup_from={tmp_path / 'w'}"])
    assert [r.overrides[:3] for r in runs] == [
        ("method=fold_no_process", f"sft_from={tmp_path / 'fold' / 'native' / 'seed0'}",
         f"warmup_from={tmp_path / 'w' / 'native' / 'seed0'}"),
        ("method=fold_no_process", f"sft_from={tmp_path / 'fold' / 'native' / 'seed2'}",
         f"warmup_from={tmp_path / 'w' / 'native' / 'seed2'}")]
