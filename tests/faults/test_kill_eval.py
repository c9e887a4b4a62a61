"""kill -9 of `memrl eval` mid-run, then the same command again: every question answered exactly once,
the answers those of an uninterrupted run, nothing finished lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

from memrl.cli import main
from memrl.data.io import write_records
from memrl.eval.runner import read_results

pytestmark = pytest.mark.slow

RECORDS = [{"input": f"what is key{i}?", "answers": [f"v{i}"], "context": f"Document 1: key{i} is v{i}. " * 3,
            "index": i, "num_docs": 1} for i in range(4)]


def test_killed_eval_resumes_without_loss_or_double_count(tmp_path, tiny_model, capsys):
    data = tmp_path / "eval_1.json"
    write_records(data, RECORDS)
    argv = [str(data), "--model", tiny_model, "--no-progress", "concurrency=1", "workflow.chunk_tokens=16",
            "workflow.max_memory_tokens=4", "workflow.max_final_tokens=3"]
    assert main(["eval", "--out", str(tmp_path / "straight"), *argv]) == 0
    straight = {r["task_id"]: r["prediction"] for r in read_results(tmp_path / "straight" / "results.jsonl")}
    env = {**os.environ, "MEMRL_FAULT_AT": "trajectory@2",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-m", "memrl.cli", "eval", "--out", str(out), *argv], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert len(read_results(out / "results.jsonl")) == 2  # written as each question finished
    capsys.readouterr()
    assert main(["eval", "--out", str(out), *argv]) == 0
    rows = read_results(out / "results.jsonl")
    assert sorted(r["task_id"] for r in rows) == ["0", "1", "2", "3"]
    assert {r["task_id"]: r["prediction"] for r in rows} == straight
