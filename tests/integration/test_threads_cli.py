"""`memrl train` and `memrl eval` run with their `threads` section, end to end in child processes on the tiny
model: torch's thread counts in the process that trained / evaluated (its metrics rows, eval_config.json)
and the wait policy torch's OpenMP runtime read at its start (OMP_DISPLAY_ENV, libgomp)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memrl.data.memagent_files import write_eval_json
from memrl.types import Task

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _memrl(*argv: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MEMRL_THREADS")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "memrl.cli", *argv], capture_output=True, text=True,
                          env={**base, "OMP_DISPLAY_ENV": "VERBOSE", **env}, cwd=ROOT, timeout=900)


@pytest.fixture(scope="module")
def tiny() -> str:
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def test_train_runs_with_one_thread_and_passive_waits(tiny, tmp_path):
    r = _memrl("train", f"model.path={tiny}", f"out_dir={tmp_path / 'run'}", "trainer.steps=1",
               "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
               "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2",
               "algorithm.n=2", "trainer.progress=false", "trainer.tensorboard=false", "trainer.loggers=[jsonl]",
               "engine.name=hf", "threads.intra_op=1")
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert (row["threads/intra_op"], row["threads/inter_op"], row["threads/passive"]) == (1.0, 1.0, 1.0)
    if "OMP_WAIT_POLICY = " in r.stderr:  # libgomp displays what it read when torch loaded
        assert "OMP_WAIT_POLICY = 'PASSIVE'" in r.stderr and "GOMP_SPINCOUNT = '0'" in r.stderr


def test_eval_records_its_threads(tiny, tmp_path):
    data = tmp_path / "eval_2.json"
    write_eval_json(data, [Task("q0", "Which city?", "Document 1:\nParis is a city.\n\nDocument 2:\nfiller",
                                ["Paris"], meta={"num_docs": 2})])
    out = tmp_path / "out"
    r = _memrl("eval", "--model", tiny, "--out", str(out), "--no-progress", str(data), "workflow.chunk_tokens=64",
               "workflow.max_memory_tokens=4", "workflow.max_final_tokens=4", "threads.intra_op=1",
               "threads.wait_policy=active")
    assert r.returncode == 0, r.stderr[-2000:]
    saved = json.loads((out / "eval_config.json").read_text())["threads"]
    assert (saved["intra_op"], saved["inter_op"], saved["wait_policy"]) == (1, 1, "ACTIVE")
    assert saved["cpus"] == len(os.sched_getaffinity(0))


RAY_PROBE = """
import json, os, sys
from memrl.config import load_config
from memrl.threads import apply
from memrl.training.config import TrainConfig
from memrl.training.ranks.placement import connect

cfg = load_config(TrainConfig, ["model.path=x", "data.path=x", "ray.num_cpus=2", "ray.temp_dir=" + sys.argv[1],
                                *sys.argv[2:]])
apply(cfg.threads)  # what memrl train does before it builds anything
connect(cfg)
import ray

@ray.remote(num_cpus=1)
class Rank:  # as RankActor.setup and the engine replicas do
    def threads(self):
        from memrl.threads import apply_inherited
        return {**apply_inherited(), "env": os.environ.get("OMP_WAIT_POLICY")}

print(json.dumps(ray.get(Rank.remote().threads.remote())))
ray.shutdown()
"""


def _ray_probe(*overrides: str) -> dict:
    pytest.importorskip("ray")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rt", dir="/tmp") as tmp:  # AF_UNIX paths stay short
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MEMRL_THREADS")}
        env.update({"RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)})
        out = subprocess.run([sys.executable, "-c", RAY_PROBE, tmp, *overrides], env=env, capture_output=True,
                             text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ray_workers_inherit_the_section():
    got = _ray_probe("threads.wait_policy=active")
    # intra_op's default in an actor of one CPU: Ray's OMP_NUM_THREADS=1; the policy was in its environment
    assert (got["intra_op"], got["inter_op"], got["wait_policy"], got["env"]) == (1, 1, "ACTIVE", "ACTIVE")
    got = _ray_probe("threads.intra_op=2")
    assert (got["intra_op"], got["wait_policy"]) == (2, "PASSIVE")
