"""`memrl demo --agent infmem` end to end at toy sizes (tiny model, a few SFT / RL steps) for both methods:
every stage ran and results.json holds hand-derivable counts; the trained table of benchmarks/infmem_trained.py
by hand on fabricated results.json files; bad config refused in one line before any work."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.eval.fields import one

pytestmark = pytest.mark.slow
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import infmem_trained as bench  # noqa: E402

TOY = ["sft.num_tasks=6", "sft.epochs=1", "sft.batch_rows=8", "eval.num_tasks=4", "eval.multipliers=[1,2]",
       "eval.far_multipliers=[2]", "threads=1", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
       "model.num_kv_heads=1", "train.trainer.steps=2", "train.trainer.batch_size=2", "train.algorithm.n=2",
       "train.trainer.progress=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("infmem_demo")
    out = {}
    for method in ("infmem", "memagent"):
        rc = main(["demo", "--agent", "infmem", "--out", str(root / method), f"method={method}", *TOY])
        assert rc == 0
        out[method] = root / method
    return out


@pytest.mark.parametrize("method, rows_per_task, scripted", [
    # the oracle at the training length (8 chunks): plan (retrieve the key, top_k 1) -> memory (the fact) ->
    # plan: STOP -> final = 4 calls, 1 chunk read, 1 retrieval, stopped at step 1
    ("infmem", 4, {"model_calls": 4.0, "chunks_read": 1.0, "retrievals": 1.0, "stop_rate": 100.0, "stop_step": 1.0}),
    # MemAgent: one memory call per chunk + the final = 9 calls, 8 chunks read, never stops
    ("memagent", 9, {"model_calls": 9.0, "chunks_read": 8.0, "retrievals": 0.0, "stop_rate": 0.0, "stop_step": 0.0}),
])
def test_infmem_demo_runs_every_stage(runs, method, rows_per_task, scripted):
    out = runs[method]
    for name in ("results.md", "results.json", "demo_config.yaml", "sft/config.json", "rl/metrics.jsonl",
                 "rl/checkpoints/step_000002/model.safetensors", "data/heldout_tasks.jsonl", "init/config.json"):
        assert (out / name).is_file(), name
    res = json.loads((out / "results.json").read_text())
    train, facts = res["train"], res["facts"]
    assert res["method"] == method and train["workflow"]["name"] == method and train["algorithm"]["name"] == "grpo"
    assert train["data"]["synthetic"]["num_chunks"] == 8 and facts["lengths"] == [8, 16]
    assert res["config"]["eval"]["num_tasks"] == 4
    cold = facts["cold_start"]
    assert {k: cold[k] for k in ("rows", "rows_per_task")} == {"rows": 6 * rows_per_task,
                                                                 "rows_per_task": [rows_per_task] * 6}
    # 6 tasks x rows_per_task rows in batches of 8, one epoch: 24 rows -> 3 steps, 54 rows -> 7 steps
    assert len(res["losses"]["sft"]) == -(-6 * rows_per_task // 8)
    assert len(res["history"]) == 2 and res["losses"]["copy_warmup"] == []
    s = cold["summary"]
    assert s["accuracy"] == 100.0 and s["num_tasks"] == 6.0 and s["chunks"] == 8.0
    assert {k: s[k] for k in scripted} == scripted
    # the summary rows in evaluation order: per length, greedy then sampled
    assert [(r["policy"], r["bucket"], r["decoding"]) for r in res["summary"]] == [
        (p, n, m) for p in ("sft", "rl") for n in ("8", "16") for m in ("greedy", "sampled")]
    for policy in ("sft", "rl"):
        for n in (8, 16):
            for mode in ("greedy", "sampled"):
                r = one(res["summary"], policy=policy, decoding=mode, bucket=str(n))
                assert r["num_tasks"] == 4.0 and (r["accuracy"] / 25).is_integer()  # 4 tasks: steps of 25 points
                assert r["chunks"] == n
                if method == "memagent":  # reads everything: n memory calls + the final
                    assert (r["model_calls"], r["chunks_read"], r["retrievals"], r["stop_rate"]) == (n + 1, n, 0, 0)
                else:  # per trajectory: a plan and a memory call per chunk read, a stop's plan call, the final
                    assert math.isclose(r["model_calls"], 2 * r["chunks_read"] + r["stop_rate"] / 100 + 1)
                    assert r["chunks_read"] <= n


def test_both_methods_share_the_tokenizer_initial_model_and_heldout_tasks(runs):
    a, b = runs["infmem"], runs["memagent"]
    for name in ("init/tokenizer.json", "init/model.safetensors", "data/heldout_tasks.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    tasks = [json.loads(line) for line in (a / "data" / "heldout_tasks.jsonl").read_text().splitlines()]
    assert [t["length"] for t in tasks] == [8] * 4 + [16] * 4
    # the 16-chunk set (eval.far_multipliers) holds the asked fact in its first ceil(0.25 x 16) = 4 pieces
    far = [c for t in tasks if t["length"] == 16 for c in t["meta"]["fact_chunks"].values()]
    assert len(far) == 4 and max(far) < 4
    res = json.loads((a / "results.json").read_text())
    assert res["heldout_sha256"] == json.loads((b / "results.json").read_text())["heldout_sha256"]


@pytest.mark.parametrize("overrides, message", [
    (["method=mem1"], "method"),
    (["eval.far_multipliers=[3]"], "eval.far_multipliers: 3 is not one of eval.multipliers [1, 4, 16]"),
    (["train.data.synthetic.min_chunks=2"], "the demo needs fixed-length one-fact tasks"),
    (["workflow.chunk_tokens=4"], "workflow.chunk_tokens 4 must equal train.data.synthetic.chunk_words 8"),
    (["eval.far_span=0"], "eval.far_span"),
])
def test_infmem_demo_refuses_bad_config_in_one_line(tmp_path, capsys, overrides, message):
    rc = main(["demo", "--agent", "infmem", "--out", str(tmp_path / "d"), *overrides])
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "d" / "data").exists()


def _fake(method: str, seed: int, acc: float, calls: float, sha: str = "abc") -> dict:
    cell = {"bucket": "8", "accuracy": acc, "model_calls": calls, "chunks_read": calls - 1}
    return {"method": method, "config": {"eval": {"num_tasks": 100}},
            "train": {"data": {"synthetic": {"num_chunks": 8}}}, "facts": {"lengths": [8]}, "heldout_sha256": [sha],
            "summary": [{"policy": "sft", "decoding": "greedy", **cell}, {"policy": "sft", "decoding": "sampled", **cell},
                        {"policy": "rl", "decoding": "greedy", **cell, "accuracy": acc + 10},
                        {"policy": "rl", "decoding": "sampled", **cell}]}


def _write(root: Path, method: str, seed: int, res: dict) -> None:
    d = root / method / "native" / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps(res))


def test_trained_table_by_hand(tmp_path, capsys):
    for seed, (acc, calls) in enumerate(((80.0, 4.0), (90.0, 5.0))):
        _write(tmp_path, "infmem", seed, _fake("infmem", seed, acc, calls))
    for seed, (acc, calls) in enumerate(((70.0, 9.0), (90.0, 9.0))):
        _write(tmp_path, "memagent", seed, _fake("memagent", seed, acc, calls))
    assert bench.main(["--trained", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # infmem accuracy 80, 90: mean 85, SE = sd / sqrt(2) = 7.07 / 1.414 = 5.0; calls 4, 5: 4.50 +- 0.50;
    # vs MemAgent per seed 4/9 - 1 = -55.6%, 5/9 - 1 = -44.4%: mean -50.0, SE 5.6
    assert "| infmem | SFT | greedy | 8 | 2 | 85.0 ± 5.0 | 4.50 ± 0.50 | 3.50 ± 0.50 | -50.0 ± 5.6 |" in lines
    assert "| infmem | SFT + RL | greedy | 8 | 2 | 95.0 ± 5.0 | 4.50 ± 0.50 | 3.50 ± 0.50 | -50.0 ± 5.6 |" in lines
    # memagent against itself: 0 on every seed; accuracy 70, 90: 80 ± 10
    assert "| memagent | SFT | sampled | 8 | 2 | 80.0 ± 10.0 | 9.00 ± 0.00 | 8.00 ± 0.00 | +0.0 ± 0.0 |" in lines
    _write(tmp_path, "memagent", 2, _fake("memagent", 2, 50.0, 9.0, sha="other"))
    with pytest.raises(SystemExit, match="evaluated other held-out tasks"):
        bench.main(["--trained", str(tmp_path)])


def test_trained_refuses_a_run_of_another_method(tmp_path):
    _write(tmp_path, "infmem", 0, _fake("memagent", 0, 80.0, 4.0))
    with pytest.raises(SystemExit, match="is a run of method 'memagent', not infmem"):
        bench.main(["--trained", str(tmp_path)])


def test_infmem_seeds_end_to_end(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["demo", "--agent", "infmem", "--out", str(out), "--seeds", "0,1", "method=infmem", *TOY]
    assert main(argv) == 0
    table = (out / "seeds_results.md").read_text()
    assert table in capsys.readouterr().out
    assert "mean ± sd over training seeds 0, 1 (n = 2)" in table and "| RL - SFT | sampled | 16 |" in table
    res = [json.loads((out / "native" / f"seed{k}" / "results.json").read_text()) for k in (0, 1)]
    assert res[0]["losses"]["sft"] != res[1]["losses"]["sft"]  # the seed changes the training, not the held-out tasks
    assert res[0]["heldout_sha256"] == res[1]["heldout_sha256"]
    marker = json.loads((out / "native" / "seed1" / "sweep_run.json").read_text())
    assert marker["overrides"][-4:] == ["seed=1", "sft.seed=501", "train.data.seed=1001", "train.trainer.seed=1"]
    agg = json.loads((out / "seeds_results.json").read_text())
    cell = agg["capabilities"]["native"]["cells"]["greedy"]["8"]["gain_model_calls"]  # decoding -> length -> cell
    assert cell["values"] == [one(r["summary"], policy="rl", decoding="greedy", bucket="8")["model_calls"]
                              - one(r["summary"], policy="sft", decoding="greedy", bucket="8")["model_calls"] for r in res]
