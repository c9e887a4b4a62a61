"""`memrl demo --agent memact` end to end at a toy budget: every output is written and the table is
results.json's numbers."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main

pytestmark = pytest.mark.slow


def test_memact_demo_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(["demo", "--agent", "memact", "--out", str(out), "sft.num_tasks=40", "sft.epochs=1",
               "sft.copy_warmup_steps=3",
               "eval.num_tasks=8", "rl_tasks=30", "threads=1", "train.trainer.steps=2",
               "train.trainer.batch_size=2", "train.algorithm.n=2", "train.algorithm.segments_per_task=3",
               "train.trainer.progress=false"])
    assert rc == 0
    for name in ("results.md", "results.json", "memact_results.png", "demo_config.yaml", "sft/config.json",
                 "copy_warmup/metrics.jsonl",
                 "rl/metrics.jsonl", "rl/checkpoints/step_000002/model.safetensors", "data/train_tasks.jsonl",
                 "data/heldout_tasks.jsonl"):
        assert (out / name).is_file(), name
    res = json.loads((out / "results.json").read_text())
    table = (out / "results.md").read_text()
    assert table in capsys.readouterr().out
    budget = res["facts"]["budget"]
    assert len(res["losses"]["copy_warmup"]) == 3
    assert len(res["history"]) == 2 and budget["eval_tasks"] == 8
    assert [(r["policy"], r["decoding"], r["bucket"]) for r in res["summary"]] == [
        (p, d, "all") for p in ("sft", "rl") for d in ("greedy", "sampled")]
    for label, r in zip(("cold start (SFT)",) * 2 + ("SFT + DCPO",) * 2, res["summary"], strict=True):
        dec = r["decoding"]
        assert r["num_tasks"] == 8 and (r["accuracy"] / 12.5).is_integer()  # 8 tasks: steps of 12.5 points
        assert r["peak_context_tokens"] <= budget["max_context_tokens"] + 0.0
        # the default tasks draw 2 or 3 sub-questions: one accuracy per count (None where no task has it)
        q2, q3 = (0.0 if r[f"accuracy_{k}q"] is None else r[f"accuracy_{k}q"] for k in (2, 3))
        row = (f"| {label} | {dec} | {r['accuracy']:.1f} | {r['accuracy_se']:.1f} | "
               f"{q2:.1f} | {q3:.1f} | {r['subq_accuracy']:.1f} | "
               f"{r['mean_context_tokens']:.1f} | {r['peak_context_tokens']:.1f} | {r['prunes_per_task']:.2f} | "
               f"{r['overflow']:.1f} |")
        assert row in table
    d = res["facts"]["cold_start"]["summary"]
    assert 0.0 <= d["overflow"] < 100.0 and d["accuracy"] + d["overflow"] <= 100.0 + 1e-9
    png = (out / "memact_results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_memact_demo_refuses_unknown_override_before_work(tmp_path, capsys):
    rc = main(["demo", "--agent", "memact", "--out", str(tmp_path / "d"), "sft.epoch=1"])
    assert rc != 0
    assert "sft.epoch" in capsys.readouterr().err
    assert not (tmp_path / "d" / "data").exists()
