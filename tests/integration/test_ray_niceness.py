"""`ray.worker_niceness`: a local Ray start that memrl makes puts its workers that many nice levels below the
driver (Ray's own default is 15). Each case starts a fresh local Ray in a subprocess, so no Ray session of
another test module is reused (Ray applies the setting only when it starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, sys
import ray
from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks.placement import connect

cfg = load_config(TrainConfig, ["model.path=x", "data.path=x", "ray.num_cpus=1", "ray.temp_dir=" + sys.argv[1],
                                *sys.argv[2:]])
connect(cfg)

@ray.remote
def niceness():
    return os.nice(0)

print(json.dumps({"driver": os.nice(0), "worker": ray.get(niceness.remote())}))
ray.shutdown()
"""


def probe(*overrides: str) -> dict[str, int]:
    # Ray's socket paths must stay under AF_UNIX's 107 characters: a short folder in /tmp
    with tempfile.TemporaryDirectory(prefix="rn", dir="/tmp") as tmp:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
        env.pop("RAY_worker_niceness", None)
        out = subprocess.run([sys.executable, "-c", PROBE, tmp, *overrides], env=env, capture_output=True,
                             text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_local_ray_workers_run_at_the_drivers_priority_by_default():
    got = probe()
    assert got["worker"] == got["driver"]


def test_worker_niceness_lowers_the_workers_by_that_many_levels():
    got = probe("ray.worker_niceness=3")
    assert got["worker"] == min(19, got["driver"] + 3)
