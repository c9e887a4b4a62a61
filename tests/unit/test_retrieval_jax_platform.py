"""bm25s imports jax when it is installed and runs a top-k on jax's default device at import; with a CUDA
jax that preallocates 75% of the GPU outside torch's allocator (seen on an H200: 106 GiB after a MemAct
run). memrl's BM25 module keeps jax on the CPU unless the user chose its platforms or already runs jax."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOW = "import os, memrl.services.retrieval; print(os.environ.get('JAX_PLATFORMS'))"


def _platforms(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if env_value is not None:
        env["JAX_PLATFORMS"] = env_value
    proc = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_jax_defaults_to_the_cpu_when_bm25s_is_imported():
    assert _platforms(None) == "cpu"


def test_a_platform_the_user_named_is_kept():
    assert _platforms("cuda") == "cuda"
