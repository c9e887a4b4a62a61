"""`memrl demo --seeds --cpu-capability` end to end at a toy budget, for both agents: one subprocess per run,
the seeds change the training and not the held-out tasks, a second call redoes nothing, the table is
printed and written."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main

pytestmark = pytest.mark.slow

MEMAGENT_TOY = ["sft.num_tasks=40", "sft.epochs=1", "sft.p_aware=0.5", "eval.num_tasks=8", "eval.samples=3",
                "eval.multipliers=[1,2]", "train.data.synthetic.min_chunks=1", "train.data.synthetic.num_chunks=2",
                "train.trainer.steps=2", "train.trainer.batch_size=2", "train.algorithm.n=2",
                "train.trainer.progress=false", "train.trainer.tensorboard=false", "threads=1"]
MEMACT_TOY = ["sft.num_tasks=40", "sft.epochs=1", "sft.copy_warmup_steps=3", "eval.num_tasks=8", "rl_tasks=30",
              "threads=1", "train.trainer.steps=2", "train.trainer.batch_size=2", "train.algorithm.n=2",
              "train.algorithm.segments_per_task=3", "train.trainer.progress=false"]


def test_memagent_seeds_end_to_end(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["demo", "--out", str(out), "--seeds", "0,1", "--cpu-capability", "default", *MEMAGENT_TOY]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    table = (out / "seeds_results.md").read_text()
    assert table in printed
    assert "ATEN_CPU_CAPABILITY=default: mean ± sd over training seeds 0, 1 (n = 2)" in table
    res = [json.loads((out / "default" / f"seed{k}" / "results.json").read_text()) for k in (0, 1)]
    def row(r: dict, policy: str, n: str) -> dict:  # a summary row of results.json's one layout
        return next(s for s in r["summary"] if (s["policy"], s["decoding"], s["bucket"]) == (policy, "sampled", n))

    assert res[0]["losses"]["sft"] != res[1]["losses"]["sft"]  # the seed changes the training ...
    assert res[0]["heldout_sha256"] == res[1]["heldout_sha256"]  # ... not the held-out tasks
    for n in ("2", "4"):  # the scripted demonstrator scores the same on each
        d0, d1 = (row(r, "demonstrator", n) for r in res)
        assert (d0["accuracy"], d0["per_task"]) == (d1["accuracy"], d1["per_task"])
    agg = json.loads((out / "seeds_results.json").read_text())
    cell = agg["capabilities"]["default"]["cells"]["sampled"]["2"]["gain_accuracy"]  # decoding -> length -> cell
    assert cell["values"] == [row(r, "rl", "2")["accuracy"] - row(r, "sft", "2")["accuracy"] for r in res]
    mtimes = [(out / "default" / f"seed{k}" / "results.json").stat().st_mtime_ns for k in (0, 1)]
    assert main(argv) == 0
    assert capsys.readouterr().out.count("finished before, kept") == 2
    assert [(out / "default" / f"seed{k}" / "results.json").stat().st_mtime_ns for k in (0, 1)] == mtimes


def test_memact_seeds_end_to_end(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["demo", "--agent", "memact", "--out", str(out), "--seeds", "1", "--cpu-capability", "default",
                 *MEMACT_TOY]) == 0
    table = (out / "seeds_results.md").read_text()
    assert table in capsys.readouterr().out
    assert "| DCPO - SFT | greedy |" in table
    marker = json.loads((out / "default" / "seed1" / "sweep_run.json").read_text())
    assert marker["overrides"][-5:] == ["seed=1", "sft.seed=501", "rl_task_seed=101", "train.data.seed=8",
                                        "train.trainer.seed=1"]
    assert main(["demo", "--agent", "memact", "--out", str(out), "--seeds", "x"]) == 2
    assert "memrl demo: error: --seeds: expected comma-separated integers like 0,1,2, got 'x'" in \
        capsys.readouterr().err
