"""scripts/migrate_results.py: a results.json of the layouts before the one layout (here real ones, written by
the memagent, lookback, memact, context (fold), mem1 and infmem demos at the toy sizes of
scripts/demo_identity.py before the change) converts into
the one layout, the method's table renders the very results.md the old run wrote from it, and a file it cannot
read fails in one line."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from memrl.recipes.pipeline import markdown

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "old_results"
_spec = importlib.util.spec_from_file_location("migrate_results", ROOT / "scripts" / "migrate_results.py")
mig = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mig)


def old(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def summary_row(res: dict, policy: str, decoding: str, bucket: str) -> dict:
    return next(s for s in res["summary"] if (s["policy"], s["decoding"], s["bucket"]) == (policy, decoding, bucket))


def test_memagent_old_layout_converts_and_renders_the_same_table():
    from memrl.recipes.memagent import RECIPE

    src = old("memagent")
    res = mig.migrate(src, "memagent")
    assert set(res) == {"recipe", "method", "config", "train", "facts", "timings", "losses", "history", "summary"}
    assert res["facts"] == {"lengths": [2, 4]} and res["train"]["data"]["synthetic"]["num_chunks"] == 2
    assert res["history"] == [{"reward/mean": 0.0}, {"reward/mean": 0.0}]  # rl_reward, 2 RL steps
    # stages -> length -> decoding -> record becomes one flat summary row per (policy, decoding, length)
    assert [(s["policy"], s["decoding"], s["bucket"]) for s in res["summary"]] == [
        ("demonstrator", "sampled", "2"), ("demonstrator", "sampled", "4"),
        *((p, d, n) for p in ("sft", "rl") for n in ("2", "4") for d in ("greedy", "sampled"))]
    d4 = summary_row(res, "demonstrator", "sampled", "4")
    rec = src["stages"]["demonstrator"]["4"]["sampled"]
    assert (d4["accuracy"], d4["se"], d4["samples"], d4["per_task"]) == (41.666666666666664, 15.105449452916098, 3,
                                                                         rec["per_task"])
    assert d4["answer_seen"] == rec["metrics"]["answer_seen"] and "seconds" not in d4 and "metrics" not in d4
    # the timings come along too, so even the "Time:" line is the old run's
    assert markdown(RECIPE, res) == (DATA / "memagent.md").read_text(encoding="utf-8")


def test_lookback_old_layout_converts_and_renders_the_same_table():
    from memrl.recipes.lookback import RECIPE

    res = mig.migrate(old("lookback_rememr1"), "lookback")
    assert res["method"] == "rememr1" and res["train"]["algorithm"] == {"name": "rememr1"}
    assert res["facts"]["streams"] == {"rl": 1, "sft": 2}
    assert res["facts"]["cold_start"]["rememr1"] == {"rows": 22, "recall_steps": 1, "accuracy": 100.0}
    pooled = summary_row(res, "oracle", "greedy", "all")
    assert (pooled["n"], pooled["accuracy"], pooled["recall_rate"], pooled["callback_hit_rate"]) == (
        4, 100.0, 1 / 12, 1.0)  # one recall over 12 memory steps, and it hit
    assert summary_row(res, "sft", "greedy", "4")["callback_hit_rate"] is None  # no recalls
    assert {s["policy"] for s in res["summary"]} == {"oracle", "sft", "rl", "rl_norecall"}
    assert markdown(RECIPE, res) == (DATA / "lookback_rememr1.md").read_text(encoding="utf-8")


def test_memact_old_layout_converts_and_renders_the_same_table():
    from memrl.recipes.memact import RECIPE

    src = old("memact")
    res = mig.migrate(src, "memact")
    assert res["method"] == "memact" and res["facts"]["budget"] == {"max_context_tokens": 181, "eval_tasks": 8}
    # the old "dcpo" entry is policy rl; one bucket, "all"
    assert [(s["policy"], s["decoding"], s["bucket"]) for s in res["summary"]] == [
        (p, d, "all") for p in ("sft", "rl") for d in ("greedy", "sampled")]
    assert summary_row(res, "rl", "sampled", "all")["max_context_tokens"] == src["dcpo"]["sampled"]["max_context_tokens"]
    cold = res["facts"]["cold_start"]["summary"]
    assert (cold["policy"], cold["accuracy_3q"], cold["num_tasks"]) == ("cold_start", 30.434782608695656, 40.0)
    # the old "rl" entry's six per-step metrics become RL's history, one dict per step
    assert len(res["history"]) == 2 and set(res["history"][0]) == set(src["rl"])
    assert markdown(RECIPE, res) == (DATA / "memact.md").read_text(encoding="utf-8")


def test_context_old_layout_converts_and_renders_the_same_table():
    from memrl.recipes.context import RECIPE

    src = old("context_fold")
    res = mig.migrate(src, "context")
    assert res["facts"]["process_rewards"] == ["unfolded", "scope", "failure"] and res["config"] == {"sft_from": ""}
    # the unbounded reference and the scripted agent are summary rows of their own policies
    assert [(s["policy"], s["decoding"]) for s in res["summary"]] == [
        ("react_unbounded", "greedy"), ("scripted", "greedy"), ("sft", "greedy"), ("sft", "sampled"), ("rl", "greedy"),
        ("rl", "sampled")]
    assert summary_row(res, "react_unbounded", "greedy", "all")["peak_context_tokens"] == 784.0
    assert res["facts"]["cold_start"]["rows"] == 72 and len(res["history"]) == 2
    assert markdown(RECIPE, res) == (DATA / "context_fold.md").read_text(encoding="utf-8")


def test_mem1_old_layout_converts_in_evaluation_order_and_renders_the_same_table():
    from memrl.recipes.mem1 import RECIPE

    src = old("mem1_mem1")
    res = mig.migrate(src, "mem1")
    assert res["config"] == {"eval": {"objectives": [2, 4, 8, 16], "num_tasks": 2},
                             "task": {"sub_questions": list(range(2, 17))}}
    assert res["facts"]["positions"]["full_history_scripted_peak"] == 716
    # decoding -> count becomes the evaluation's order: each count's greedy, then sampled
    ks = ("2", "4", "8", "16")
    assert [(s["policy"], s["decoding"], s["bucket"]) for s in res["summary"]] == [
        *(("scripted", "greedy", k) for k in ks), *((p, d, k) for p in ("sft", "rl") for k in ks
                                                     for d in ("greedy", "sampled"))]
    assert summary_row(res, "sft", "sampled", "4")["peak_context_tokens"] == src["sft"]["sampled"]["4"]["peak_context_tokens"]
    assert res["facts"]["cold_start"]["summary"]["policy"] == "cold_start"
    assert markdown(RECIPE, res) == (DATA / "mem1_mem1.md").read_text(encoding="utf-8")


def test_infmem_old_layout_converts_and_renders_the_same_table():
    from memrl.recipes.infmem import RECIPE

    res = mig.migrate(old("infmem_infmem"), "infmem")
    assert res["train"]["data"]["synthetic"]["num_chunks"] == 8 and res["facts"]["lengths"] == [8, 16]
    assert res["facts"]["cold_start"] == {
        "summary": {"policy": "cold_start", "decoding": "greedy", "bucket": "all", "accuracy": 100.0,
                    "accuracy_se": 0.0, "model_calls": 4.0, "chunks_read": 1.0, "chunks": 8.0, "retrievals": 1.0,
                    "tokens_read": 8.0, "stop_rate": 100.0, "stop_step": 1.0, "num_tasks": 6.0},
        "rows": 24, "rows_per_task": [4, 4, 4, 4, 4, 4]}
    assert [(s["policy"], s["bucket"], s["decoding"]) for s in res["summary"]] == [
        (p, n, d) for p in ("sft", "rl") for n in ("8", "16") for d in ("greedy", "sampled")]
    assert markdown(RECIPE, res) == (DATA / "infmem_infmem.md").read_text(encoding="utf-8")


def test_the_command_writes_the_file_and_refuses_what_it_cannot_read(tmp_path, capsys):
    out = tmp_path / "new.json"
    assert mig.main([str(DATA / "memagent.json"), "--method", "memagent", "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.endswith("}\n") and json.loads(text) == mig.migrate(old("memagent"), "memagent")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases = [([str(tmp_path / "missing.json"), "--method", "memagent"], r"missing\.json: unreadable \(No such file"),
             ([str(bad), "--method", "memagent"], r"bad\.json: unreadable \(Expecting property name"),
             ([str(DATA / "memagent.json"), "--method", "lookback"],
              r"memagent\.json: not a lookback demo result of the old layout \(no method\)$"),
             ([str(DATA / "memagent.json"), "--method", "nope"], r"^--method: one of .*memagent.*, got 'nope'$"),
             ([str(out), "--method", "memagent"], r"new\.json: already in the one results layout$")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            mig.main(argv)
        assert re.search(message, str(e.value)) and "\n" not in str(e.value), (argv, e.value)
