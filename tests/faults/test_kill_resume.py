"""kill -9 during training (mid-rollout, at each phase of a checkpoint save), then --resume: the run
ends bit-identical to an uninterrupted one, no save leftovers remain, metrics hold each step once."""

from __future__ import annotations

import json
import logging
import signal

import pytest
from conftest import assert_same_weights, make_trainer, run_child

from memrl.training.monitor.metrics_log import read_metrics

pytestmark = pytest.mark.slow

# fault point -> (checkpoint `latest` names after the kill, temp dirs left, metrics rows left)
# Steps hold 2 tasks x 2 samples = 4 trajectories: trajectory@6 is the middle of step 2's rollout.
CASES = {
    "trajectory@6": ("step_000001", 0, [1]),
    "ckpt_tmp@2": ("step_000001", 1, [1, 2]),
    "ckpt_weights@2": ("step_000001", 1, [1, 2]),
    "ckpt_state@2": ("step_000001", 1, [1, 2]),
    "ckpt_renamed@2": ("step_000001", 0, [1, 2]),
    "ckpt_latest@2": ("step_000002", 0, [1, 2]),
}


@pytest.mark.parametrize("fault", list(CASES))
def test_kill_then_resume_matches_uninterrupted_run(fault, tiny_model, reference, tmp_path, caplog):
    ref_out, ref_weights, ref_rows = reference
    out = tmp_path / "run"
    proc = run_child(tiny_model, out, fault)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpts = out / "checkpoints"
    latest, leftovers, rows = CASES[fault]
    assert (ckpts / "latest").read_text().strip() == latest
    assert len(list(ckpts.glob(".step_*"))) == leftovers
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == rows

    with caplog.at_level(logging.INFO):
        trainer = make_trainer(tiny_model, out, resume=True)
        trainer.fit()
    step = int(latest[-6:])
    said = [r.getMessage() for r in caplog.records]
    assert f"resumed from {ckpts / latest} (step {step}, data position {2 * step})" in said
    if leftovers:
        assert any(m.startswith(f"removed 1 leftover(s) of an interrupted checkpoint save in {ckpts}: .step_000002-")
                   for m in said)
    redone = [r for r in rows if r > step]
    if redone:
        assert f"{out / 'metrics.jsonl'}: replaced {len(redone)} row(s) of steps after {step}, which are redone" in said
    # nothing finished was lost, nothing is left behind, nothing is counted twice
    assert_same_weights(ref_weights, trainer.model.state_dict())
    assert not list(ckpts.glob(".*step_*")) and not (ckpts / ".latest.tmp").exists()
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000001", "step_000002", "step_000003"]
    got = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2, 3]
    keys = ("reward/mean", "loss/total", "data/position", "format/no_box")  # format counts are logged too
    for a, b in zip(ref_rows, got, strict=True):
        assert [a[k] for k in keys] == [b[k] for k in keys]
        assert 0 <= b["format/no_box"] <= 4


def test_trajectory_dump_holds_each_step_once_after_a_kill_during_a_save(tiny_model, tmp_path, caplog):
    """Step 2 is dumped, then the run dies saving its checkpoint: the resumed run redoes step 2 and replaces
    its dumped rows (as metrics.jsonl's), so trajectories.jsonl holds steps 1, 2, 3 once each."""
    from memrl.training.monitor.dump import DUMP_FILE

    out = tmp_path / "run"
    dump = ("trainer.dump_every=1", "trainer.dump_trajectories=2")  # one group of 2 trajectories per step
    proc = run_child(tiny_model, out, "ckpt_state@2", *dump)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]

    def steps() -> list[int]:
        return [json.loads(line)["step"] for line in (out / DUMP_FILE).read_text().splitlines()]

    assert steps() == [1, 1, 2, 2]  # step 2's rows were written before its checkpoint died
    with caplog.at_level(logging.INFO):
        make_trainer(tiny_model, out, resume=True, extra=dump).fit()
    assert steps() == [1, 1, 2, 2, 3, 3]
    said = [r.getMessage() for r in caplog.records]
    assert f"{out / DUMP_FILE}: replaced 2 row(s) of steps after 1, which are redone" in said
