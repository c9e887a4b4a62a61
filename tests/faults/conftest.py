"""Shared pieces of the fault-injection suite: the tiny model, one small RL recipe, and a reference run
that was never interrupted (every kill / damage test must end bit-identical to it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("train_child.py")
STEPS = 3


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def train_overrides(model: str, out: Path, steps: int = STEPS) -> list[str]:
    """A 3-step GRPO run on the parity workflow: 2 tasks x 2 samples, a checkpoint after every step."""
    return [
        f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memagent_parity",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=4",
        "workflow.max_final_tokens=2", "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8",
        "trainer.batch_size=2", "algorithm.n=2", "algorithm.kl_coef=0", "optim.lr=1e-3", "optim.warmup_steps=0",
        "trainer.save_every=1", "trainer.keep_checkpoints=0", "trainer.token_budget=4096",
        "trainer.progress=false", "trainer.tensorboard=false",
    ]


def make_trainer(model: str, out: Path, resume: bool = False, steps: int = STEPS, extra: tuple[str, ...] = ()):
    import train_child  # noqa: F401 - registers memagent_parity in this process too

    from memrl.config import load_config
    from memrl.training.assemble import assemble
    from memrl.training.config import TrainConfig
    from memrl.training.trainer import Trainer

    return Trainer(assemble(load_config(TrainConfig, train_overrides(model, out, steps) + list(extra)), resume=resume))


def run_child(model: str, out: Path, fault: str | None, *extra: str) -> subprocess.CompletedProcess:
    """`memrl train` (parity workflow) in a child process; MEMRL_FAULT_AT=fault kills it at that point."""
    env = {k: v for k, v in os.environ.items() if k != "MEMRL_FAULT_AT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if fault:
        env["MEMRL_FAULT_AT"] = fault
    return subprocess.run([sys.executable, str(CHILD), *train_overrides(model, out), *extra], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def reference(tiny_model, tmp_path_factory):
    """(out dir, final state dict, metrics rows) of an uninterrupted 3-step run."""
    from memrl.training.monitor.metrics_log import read_metrics

    out = tmp_path_factory.mktemp("reference") / "run"
    torch.set_num_threads(SESSION_THREADS)  # set up before the test's own _keep_torch_threads
    trainer = make_trainer(tiny_model, out)
    trainer.fit()
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return out, weights, read_metrics(out / "metrics.jsonl")


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"weight {k} differs from the uninterrupted run"


def one_line(err: str) -> str:
    """The single line a failed command printed (stderr minus library progress bars)."""
    lines = [ln for ln in err.splitlines() if ln.strip() and "it/s]" not in ln]
    assert len(lines) == 1, f"expected one line, got: {lines}"
    return lines[0]


SESSION_THREADS = torch.get_num_threads()
"""torch's thread count when the session started: what the kill tests' children (`memrl train`, whose
threads.intra_op default is every usable CPU or OMP_NUM_THREADS) run with too."""


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A test that runs a command in this process sets torch's thread count: a demo's config loader to the
    demo's `threads` (`memrl demo` refusing a damaged input, the hostile-option sweep), `memrl eval` to the
    CPUs other processes leave free (memrl.threads.auto_threads), also from a fixture set up before this one;
    the in-process resumes of the kill tests must compare against their reference at the session's count."""
    torch.set_num_threads(SESSION_THREADS)
    yield
    torch.set_num_threads(SESSION_THREADS)
