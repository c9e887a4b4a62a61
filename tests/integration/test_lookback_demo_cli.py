"""`memrl demo --agent lookback` end to end at a toy size (a few SFT tasks, one RL step, two held-out tasks per
length, greedy) for both arms: every stage ran, results.json holds the one results schema with hand-derivable counts,
both arms' cold starts are one checkpoint, and the seed sweep's aggregation (and benchmarks/lookback_compare.py
on top of it) reads two seeds' runs."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.recipes.seeds import base_seeds, seed_overrides

pytestmark = pytest.mark.slow
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

import lookback_compare as bench  # noqa: E402

TOY = ["rl_tasks=4", "sft.num_tasks=4", "sft.epochs=1", "sft.oversample_recall=3", "eval.num_tasks=2",
       "eval.lengths=[2,4]", "eval.sampled=false", "train.trainer.steps=1", "train.trainer.batch_size=1", "train.algorithm.n=2"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookback_demo")
    for arm, seed in (("memagent", 0), ("rememr1", 0), ("rememr1", 1)):
        ov = [f"method={arm}", *TOY]
        ov += seed_overrides("lookback", seed, base_seeds("lookback", ov))
        assert main(["demo", "--agent", "lookback", "--out", str(root / arm / "native" / f"seed{seed}"), *ov]) == 0
    return root


def results(root: Path, arm: str, seed: int = 0) -> dict:
    return json.loads((root / arm / "native" / f"seed{seed}" / "results.json").read_text())


def view(res: dict) -> dict:
    """policy -> decoding -> bucket -> summary row, of results.json's summary rows."""
    out: dict = {}
    for s in res["summary"]:
        out.setdefault(s["policy"], {}).setdefault(s["decoding"], {})[s["bucket"]] = s
    return out


@pytest.mark.parametrize("arm", ["memagent", "rememr1"])
def test_every_stage_ran_and_results_hold_the_one_schema(root, arm):
    out = root / arm / "native" / "seed0"
    for name in ("results.md", "demo_config.yaml", "data/train.json", "data/sft.json", "data/eval_2.json",
                 "data/eval_4.json", "model/config.json", "sft/model.safetensors",
                 "rl/checkpoints/step_000001/model.safetensors", "eval/oracle/results.jsonl", "eval/rl/results.jsonl"):
        assert (out / name).is_file(), name
    res = results(root, arm)
    assert res["recipe"] == "lookback" and res["method"] == arm and res["train"]["workflow"]["name"] == arm
    assert res["train"]["algorithm"] == {"name": {"memagent": "grpo", "rememr1": "rememr1"}[arm]}
    assert res["facts"]["streams"] == {"rl": 1, "sft": 2} and res["config"]["eval"]["lengths"] == [2, 4]
    # the rows' held-out digests: the SHA-256 of each length's file, in length order
    assert res["heldout_sha256"] == [hashlib.sha256((out / f"data/eval_{n}.json").read_bytes()).hexdigest()
                                     for n in (2, 4)]
    view = globals()["view"](res)
    policies = ["oracle", "sft", "rl"] + (["rl_norecall"] if arm == "rememr1" else [])
    assert sorted(view) == sorted(policies)
    for p in policies:
        assert list(view[p]) == ["greedy"]  # eval.sampled=false (the sampled decoding: the identity check's sizes)
        for by in view[p].values():
            assert list(by) == ["2", "4", "all"]
            for n, s in by.items():
                assert s["n"] == (4 if n == "all" else 2) and s["accuracy"] in (0, 25, 50, 75, 100)
                assert s["steps"] == 2 * (6 if n == "all" else int(n))  # one memory step per piece
                assert s["recall_rate"] == s["recalls"] / s["steps"]
                assert s["callback_hit_rate"] == (s["hits"] / s["recalls"] if s["recalls"] else None)
                if arm == "memagent" or p == "rl_norecall":
                    assert s["recalls"] == 0 and s["callback_hit_rate"] is None
    assert all(s["accuracy"] == 100.0 for s in view["oracle"]["greedy"].values()) or arm == "memagent"
    # the cold start: both workflows' traces of the 4 SFT tasks (4 pieces: 4 memory rows + the final), recall
    # steps x3; one epoch of 32-row batches
    d = res["facts"]["cold_start"]
    assert d["memagent"] == {"rows": 20, "recall_steps": 0, "accuracy": d["memagent"]["accuracy"]}
    assert d["rememr1"]["rows"] == 20 + 2 * d["rememr1"]["recall_steps"] and d["rememr1"]["accuracy"] == 100.0
    assert len(res["losses"]["sft"]) == -(-(d["memagent"]["rows"] + d["rememr1"]["rows"]) // 32)
    assert len(res["history"]) == 1 and res["losses"]["copy_warmup"] == []


def test_both_arms_cold_starts_are_one_checkpoint(root):
    a, b = (root / arm / "native" / "seed0" for arm in ("memagent", "rememr1"))
    for name in ("model/model.safetensors", "model/tokenizer.json", "sft/model.safetensors", "data/sft.json",
                 "data/eval_4.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ra, rb = results(root, "memagent"), results(root, "rememr1")
    assert ra["losses"]["sft"] == rb["losses"]["sft"] and ra["facts"]["cold_start"] == rb["facts"]["cold_start"]
    # seed 1 shifts the task streams by 2 and trains another cold start
    r1 = results(root, "rememr1", 1)
    assert r1["facts"]["streams"] == {"rl": 3, "sft": 4} and r1["heldout_sha256"] == rb["heldout_sha256"]
    assert r1["losses"]["sft"] != rb["losses"]["sft"]


def test_the_sweep_aggregates_two_seeds_and_the_benchmark_compares_the_arms(root, capsys):
    assert main(["demo", "--agent", "lookback", "--out", str(root / "rememr1"), "--seeds", "0,1", "--aggregate-only",
                 "method=rememr1", *TOY]) == 0
    agg = json.loads((root / "rememr1" / "seeds_results.json").read_text())["capabilities"]["native"]
    assert agg["seeds"] == [0, 1] and agg["buckets"] == ["2", "4", "all"] and agg["method"] == "rememr1"
    r = [view(results(root, "rememr1", k)) for k in (0, 1)]
    c = agg["cells"]["greedy"]["4"]
    for p in ("sft", "rl", "rl_norecall"):
        assert c[f"{p}_accuracy"]["values"] == [x[p]["greedy"]["4"]["accuracy"] for x in r]
    assert c["gain_accuracy"]["values"] == [x["rl"]["greedy"]["4"]["accuracy"] - x["sft"]["greedy"]["4"]["accuracy"]
                                            for x in r]
    assert agg["cells"]["greedy"]["all"]["rl_recall_rate"]["values"] == [x["rl"]["greedy"]["all"]["recall_rate"]
                                                                         for x in r]
    assert agg["cells"]["greedy"]["2"]["oracle_accuracy"]["values"] == [100.0, 100.0]
    assert list(agg["cells"]) == ["greedy"]
    # the benchmark on seed 0 of both arms (nothing run again)
    assert bench.main(["--out", str(root), "--seeds", "0", "--aggregate-only", *TOY]) == 0
    text = (root / "compare.md").read_text()
    ma, rm = view(results(root, "memagent")), r[0]
    assert (f"| rl_memagent | {ma['rl']['greedy']['2']['accuracy']:.1f} ± n/a | "
            f"{ma['rl']['greedy']['4']['accuracy']:.1f} ± n/a | - | - |") in text
    gap = rm["rl"]["greedy"]["4"]["accuracy"] - ma["rl"]["greedy"]["4"]["accuracy"]
    assert json.loads((root / "compare.json").read_text())["gaps"]["greedy"]["rememr1_minus_memagent_N4"]["values"] == [gap]
