"""kill -9 during an asynchronous run (rollout.max_staleness=1), then --resume: the batches the producer had
sampled ahead of the last checkpoint are discarded and said so, their tasks are sampled again, and no
trained (checkpointed) step is lost or counted twice."""

from __future__ import annotations

import logging
import signal

import pytest
from conftest import make_trainer, run_child

from memrl.training.monitor.metrics_log import read_metrics

pytestmark = pytest.mark.slow

ASYNC = ("rollout.max_staleness=1", "engine.hf.share_weights=false")


def _resume(tiny_model, out, caplog, steps: int = 3) -> list[str]:
    with caplog.at_level(logging.INFO):
        make_trainer(tiny_model, out, resume=True, steps=steps, extra=ASYNC).fit()
    return [r.getMessage() for r in caplog.records]


def _complete(out, steps: int = 3) -> None:
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == [f"step_{i:06d}" for i in range(1, steps + 1)]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert [r["data/position"] for r in rows] == [2.0 * i for i in range(1, steps + 1)]  # each task once, in order
    assert all(r["async/staleness_max"] <= 1 and r["async/stale_dropped"] == 0 for r in rows)


def test_kill_after_a_checkpoint_discards_the_batch_sampled_ahead(tiny_model, tmp_path, caplog):
    out = tmp_path / "run"
    proc = run_child(tiny_model, out, "ckpt_latest@2", *ASYNC)  # dies once step 2's checkpoint is committed
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_000002"
    said = _resume(tiny_model, out, caplog)
    assert f"resumed from {ckpts / 'step_000002'} (step 2, data position 4)" in said
    # at step 2's save the producer had started step 3's batch (allowed from version 1 on): 1 discarded
    assert ("asynchronous run: the 1 rollout batch(es) sampled ahead of step 2 when it was saved were "
            "discarded; their tasks (from data position 4) are sampled again") in said
    _complete(out)


def test_kill_mid_rollout_loses_no_trained_step(tiny_model, tmp_path, caplog):
    out = tmp_path / "run"
    # 4 trajectories per step; the batches of steps 1 and 2 start at once (8 trajectories), step 3's once
    # version 1 exists, step 4's once version 2 does: the 14th trajectory is in step 4's batch, sampled
    # while step 3 trains, after step 1's checkpoint (step 2's may or may not be saved yet)
    proc = run_child(tiny_model, out, "trajectory@14", *ASYNC, "trainer.steps=5")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpts = out / "checkpoints"
    latest = (ckpts / "latest").read_text().strip()
    assert latest in ("step_000001", "step_000002")  # how far the trainer got while batch 3 was sampled
    before = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    step = int(latest[-6:])
    assert before[:step] == list(range(1, step + 1))  # every checkpointed step was logged
    said = _resume(tiny_model, out, caplog, steps=5)
    assert f"resumed from {ckpts / latest} (step {step}, data position {2 * step})" in said
    assert any(m.startswith("asynchronous run: the ") and f"ahead of step {step} when" in m for m in said)
    _complete(out, steps=5)
