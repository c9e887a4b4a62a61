"""Damaged, planted and missing checkpoints on --resume: fall back to the newest good one with a warning
naming what was wrong, refuse a pickle that would run code, say when there is nothing to resume."""

from __future__ import annotations

import logging
import os
import pickle
import shutil

import pytest
import torch
from conftest import assert_same_weights, make_trainer

from memrl.training.checkpoints.checkpoint import CheckpointError, clean_stale, load_state, resume_point
from memrl.training.monitor.metrics_log import read_metrics

pytestmark = pytest.mark.slow


class _Planted:
    """Unpickling this runs `touch <marker>`: what a malicious trainer_state.pt would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _copy_run(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    return out, out / "checkpoints"


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", ["weights", "state", "optimizer", "optimizer_metadata"])
def test_damaged_latest_falls_back_to_previous_checkpoint(damage, reference, tiny_model, tmp_path, caplog):
    out, ckpts = _copy_run(reference, tmp_path)
    bad = ckpts / "step_000003" / {"weights": "model.safetensors", "state": "trainer_state.pt",
                                   "optimizer": "optimizer/__0_0.distcp",
                                   "optimizer_metadata": "optimizer/.metadata"}[damage]
    size = bad.stat().st_size
    _truncate(bad)
    with caplog.at_level(logging.INFO):
        trainer = make_trainer(tiny_model, out, resume=True)
        trainer.fit()
    why = {
        "weights": f"{bad}: not a complete safetensors file (Error while deserializing header: incomplete "
                   "metadata, file not fully covered)",
        # torch's own words for a zip archive cut in half (a small one fails before its central directory)
        "state": f"{bad}: not a readable torch state file ([Errno 22] Invalid argument)",
        "optimizer": f"{bad}: {size // 2} bytes, the metadata expects at least {size}",
        "optimizer_metadata": f"{bad}: not readable DCP metadata (UnpicklingError: pickle data was truncated)",
    }[damage]
    said = [r.getMessage() for r in caplog.records]
    assert f"checkpoint step_000003 is not usable: {why}; trying an older one" in said
    assert f"falling back to checkpoint {ckpts / 'step_000002'} (step 2)" in said
    assert f"resumed from {ckpts / 'step_000002'} (step 2, data position 4)" in said
    assert_same_weights(reference[1], trainer.model.state_dict())  # step 3 redone, bit-identical
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    load_state(ckpts / "step_000003")  # the re-save replaced the damaged one


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("container", ["torch.save", "pickle"])
def test_planted_pickle_is_refused_and_never_runs(container, reference, tiny_model, tmp_path, caplog):
    out, ckpts = _copy_run(reference, tmp_path)
    marker = tmp_path / "pwned"
    state = ckpts / "step_000003" / "trainer_state.pt"
    if container == "torch.save":
        torch.save({"step": 3, "optimizer": _Planted(str(marker))}, state)
    else:
        state.write_bytes(pickle.dumps(_Planted(str(marker))))
    with pytest.raises(CheckpointError) as e:
        load_state(state.parent)
    assert str(e.value) == (f"{state}: refused, it holds objects other than tensors and plain data "
                            "(a pickle that could run code)")
    with caplog.at_level(logging.INFO):
        trainer = make_trainer(tiny_model, out, resume=True)
        trainer.fit()
    assert f"resumed from {ckpts / 'step_000002'} (step 2, data position 4)" in [r.getMessage() for r in caplog.records]
    assert not marker.exists()
    assert_same_weights(reference[1], trainer.model.state_dict())


def test_planted_pickle_in_dcp_metadata_is_refused_and_never_runs(reference, tiny_model, tmp_path, caplog):
    """DCP's .metadata is a pickle: only DCP's own metadata classes are admitted."""
    out, ckpts = _copy_run(reference, tmp_path)
    marker = tmp_path / "pwned"
    meta = ckpts / "step_000003" / "optimizer" / ".metadata"
    meta.write_bytes(pickle.dumps(_Planted(str(marker))))
    with caplog.at_level(logging.INFO):
        trainer = make_trainer(tiny_model, out, resume=True)
        trainer.fit()
    said = [r.getMessage() for r in caplog.records]
    assert (f"checkpoint step_000003 is not usable: {meta}: not readable DCP metadata (UnpicklingError: "
            "posix.system is not part of DCP metadata); trying an older one") in said
    assert not marker.exists()
    assert_same_weights(reference[1], trainer.model.state_dict())


def test_every_checkpoint_damaged_is_an_error_not_a_silent_restart(reference, tiny_model, tmp_path, capsys):
    from conftest import train_overrides

    from memrl.cli import main

    out, ckpts = _copy_run(reference, tmp_path)
    for d in sorted(ckpts.glob("step_*")):
        _truncate(d / "trainer_state.pt")
    with pytest.raises(CheckpointError, match=f"^no usable checkpoint in {ckpts}: "):
        resume_point(ckpts)
    import train_child  # noqa: F401 - the parity workflow

    assert main(["train", *train_overrides(tiny_model, out), "--resume"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memrl train: error:")]
    assert len(err) == 1 and err[0].startswith(f"memrl train: error: no usable checkpoint in {ckpts}: ")
    assert err[0].count("not a readable torch state file") == 3
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]  # untouched


def test_resume_without_checkpoint_says_so(tiny_model, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        trainer = make_trainer(tiny_model, tmp_path / "run", resume=True, steps=0)
        trainer.fit()
    ckpts = tmp_path / "run" / "checkpoints"
    assert f"--resume: no checkpoint in {ckpts}; starting from step 0" in [r.getMessage() for r in caplog.records]
    assert trainer.step == 0


def test_clean_stale_removes_temp_dirs_and_restores_a_half_swapped_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    (root / ".step_000004-abc123").mkdir(parents=True)
    (root / ".step_000004-abc123" / "model.safetensors").write_bytes(b"x" * 10)
    (root / ".latest.tmp").write_text("step_000004\n")
    (root / ".step_000002-old").mkdir()  # killed between moving step_000002 aside and moving the new one in
    (root / ".step_000002-old" / "trainer_state.pt").write_bytes(b"state")
    (root / "step_000001").mkdir()
    assert clean_stale(root) == [".latest.tmp", ".step_000004-abc123"]
    assert sorted(p.name for p in root.iterdir()) == ["step_000001", "step_000002"]
    assert (root / "step_000002" / "trainer_state.pt").read_bytes() == b"state"


def test_garbage_latest_pointer_falls_back_to_newest_good(reference, tmp_path, caplog):
    _, ckpts = _copy_run(reference, tmp_path)
    (ckpts / "latest").write_bytes(b"\xff\xfe../../etc\n")
    with caplog.at_level(logging.WARNING):
        point = resume_point(ckpts)
    assert point.path == ckpts / "step_000003" and point.state["step"] == 3 and point.skipped == []
    assert any(r.getMessage().startswith(f"{ckpts / 'latest'} is unreadable (") for r in caplog.records)
    (ckpts / "latest").write_text("../../elsewhere\n")
    assert resume_point(ckpts).path == ckpts / "step_000003"
