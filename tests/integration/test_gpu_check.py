"""scripts/gpu_check.sh, the one prepared check a GPU machine gets, run on the CPU in its dry mode: every
section (the gpu tests collected, gpu_single, the two RL steps on 2-layer Qwen2 / Qwen3 models of the real
vocabulary, long_rows) runs the code the GPU run runs, so the check cannot rot between GPU sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_gpu_check_dry_run_runs_every_section(tmp_path):
    out = tmp_path / "check"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["section"] for s in summary] == ["tests", "steps", "long_rows", "gpu_single"]
    assert all(s["status"] == "ok" for s in summary), summary
    tests = summary[0]["headline"]
    assert "tests collected" in tests and not tests.startswith("0"), tests
    report = (out / "report.md").read_text()
    assert report.startswith("# GPU check (dry run, CPU)")
    steps = json.loads((out / "steps.json").read_text())
    assert sorted(steps) == ["qwen2.5-0.5b/memact-dcpo", "qwen2.5-0.5b/memagent-grpo", "qwen3-0.6b/memact-dcpo",
                             "qwen3-0.6b/memagent-grpo"]
    for name, r in steps.items():  # every step rolled out and trained (zero advantages are trained too)
        assert r["gen_tokens"] > 0 and r["train_tokens"] > 0, (name, r)
    single = json.loads((out / "gpu_single.json").read_text())
    assert list(single) == ["tiny/float32"] and single["tiny/float32"]["train_tok_s"] > 0


def test_gpu_check_names_an_unknown_section(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--only", "tests,nope",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "gpu_check: unknown --only ['nope']; sections: tests, steps, long_rows, gpu_single")
