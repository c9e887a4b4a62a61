"""The collapse guard end to end on the tiny random model (CPU): it never writes a box, so every memagent
trajectory is a format failure with reward 0 from the first step on; the format and dead alarms hold at
every step. warn shows one line, stop ends naming what is kept, rollback goes back, scales the learning
rate, resamples with new seeds, records the event, and a resume across the rollback is exact."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from memrl.config import load_config
from memrl.training.assemble import assemble, task_stream
from memrl.training.checkpoints.checkpoint import verify_checkpoint
from memrl.training.config import TrainConfig
from memrl.training.monitor.guard import RECORDS, SEED_STRIDE, CollapseError
from memrl.training.trainer import Trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _cfg(model: str, out, steps: int, mode: str, **extra: str) -> TrainConfig:
    ov = [
        f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memagent",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
        "workflow.max_chunks=2", "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8",
        "trainer.batch_size=2", "algorithm.n=2", "algorithm.kl_coef=0", "optim.lr=1e-3", "optim.warmup_steps=0",
        "trainer.save_every=1", "trainer.keep_checkpoints=0", "trainer.token_budget=600", "trainer.progress=false",
        "trainer.tensorboard=false", "engine.name=hf", f"trainer.on_collapse={mode}", "health.patience=2",
        "trainer.skip_zero_advantage=false",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(TrainConfig, ov)


def _rows(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_warn_shows_one_line_when_the_alarms_first_fire(tiny_path, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    hist = Trainer(assemble(_cfg(tiny_path, tmp_path / "w", 3, "warn"))).fit()
    assert [h["health/format_failure_share"] for h in hist] == [1.0, 1.0, 1.0]  # no box from a random model
    assert [h["health/zero_variance_share"] for h in hist] == [1.0, 1.0, 1.0]
    assert [h["health/streak/dead"] for h in hist] == [1.0, 2.0, 3.0]
    assert [h["health/alarms"] for h in hist] == [0.0, 2.0, 2.0]  # dead and format, from step 2 (patience 2)
    assert all("health/right_logprob" not in h for h in hist)  # no right trajectory
    assert [h["health/reward_trend"] for h in hist] == [0.0, 0.0, 0.0]
    assert all(h["health/entropy"] == h["loss/entropy"] for h in hist)
    lines = [r.message for r in caplog.records if "health alarm" in r.message]
    assert len(lines) == 1 and lines[0].startswith("step 2: health alarm (dead: every group had zero reward")
    assert lines[0].endswith("trainer.on_collapse=warn")
    assert len(_rows(tmp_path / "w")) == 3


def test_stop_ends_the_run_naming_what_is_kept(tiny_path, tmp_path):
    run = tmp_path / "s"
    with pytest.raises(CollapseError) as e:
        Trainer(assemble(_cfg(tiny_path, run, 5, "stop"))).fit()
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("step 2: training collapsed (dead: every group had zero reward variance")
    assert "stopped (trainer.on_collapse=stop); no checkpoint from before step 1 is kept" in msg
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001"]  # step 2 unsaved
    assert [r["step"] for r in _rows(run)] == [1, 2]


def test_stop_names_the_last_good_checkpoint(tiny_path, tmp_path):
    """Only the format alarm guards, with patience 2; format_share 1.0 never holds, so nothing fires: the
    dead alarm alone is logged and not acted on."""
    run = tmp_path / "g"
    hist = Trainer(assemble(_cfg(tiny_path, run, 3, "stop", **{"health.guard": "[format]",
                                                              "health.format_share": "1.0"}))).fit()
    assert [h["health/alarms"] for h in hist] == [0.0, 1.0, 1.0]  # dead fires, not guarded: the run goes on
    # the streak began at step 4, whose rollout sampled with step 3's weights: the last good ones are step 2's
    with pytest.raises(CollapseError, match=r"the last good checkpoint is .*step_000002 \(step 2, whose weights "
                                            r"sampled a step before the streak began at step 4\)"):
        Trainer(assemble(_cfg(tiny_path, run, 6, "stop", **{"health.guard": "[format]"}), resume=True)).fit()


def test_rollback_goes_back_rescales_reseeds_and_resumes_exactly(tiny_path, tmp_path):
    """Straight: save step 0; steps 1, 2 (alarms fire) -> back to step 0, lr x 0.5, seeds + 1e6; steps 1', 2'
    fire again -> max_rollbacks=1 spent: CollapseError. Interrupted: the same run stopped after step 1' was
    saved, then resumed: it ends with the same weights, optimizer state and metrics."""
    extra = {"health.max_rollbacks": "1"}
    straight = Trainer(assemble(_cfg(tiny_path, tmp_path / "a", 6, "rollback", **extra)))
    with pytest.raises(CollapseError, match="stopped after health.max_rollbacks=1 rollback"):
        straight.fit()
    rows = _rows(tmp_path / "a")
    assert [r["step"] for r in rows] == [1, 2]  # steps 1 and 2 undone, 1' and 2' logged
    assert [r["health/rollbacks"] for r in rows] == [1.0, 1.0]
    events = [json.loads(x) for x in (tmp_path / "a" / RECORDS).read_text().splitlines()]
    assert len(events) == 1
    ev = events[0]
    assert (ev["event"], ev["rollback"], ev["step"], ev["to_step"]) == ("rollback", 1, 2, 0)
    assert ev["removed"] == ["step_000001"] and ev["lr_scale"] == 0.5 and ev["seed_offset"] == SEED_STRIDE
    assert ev["alarms"] == ["dead", "format"] and ev["metrics"]["health/streak/dead"] == 2.0
    assert rows[0]["train/lr"] == 0.5e-3  # no warm-up: the peak, halved
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").glob("step_*")) == ["step_000000", "step_000001"]

    class Stop(Exception):
        pass

    class StopAfterSave(Trainer):
        def save(self):
            path = super().save()
            if self.health.rollbacks == 1 and self.step == 1:  # step 1' saved: the process ends here
                raise Stop
            return path

    first = StopAfterSave(assemble(_cfg(tiny_path, tmp_path / "b", 6, "rollback", **extra)))
    with pytest.raises(Stop):
        first.fit()
    resumed = Trainer(assemble(_cfg(tiny_path, tmp_path / "b", 6, "rollback", **extra), resume=True))
    assert resumed.health.rollbacks == 1 and resumed.step == 1
    assert resumed.rollout_seed(1) == straight.rollout_seed(1) == 0 * 100003 + 1 + SEED_STRIDE  # trainer.seed 0
    with pytest.raises(CollapseError):
        resumed.fit()
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa, sb = straight.parts.workers.opt.state_dict(), resumed.parts.workers.opt.state_dict()
    assert sa["param_groups"][0]["lr"] == sb["param_groups"][0]["lr"] == 0.5e-3
    for i in sa["state"]:
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sa["state"][i][k], sb["state"][i][k])
    rows_b = _rows(tmp_path / "b")
    assert [r["step"] for r in rows_b] == [1, 2]
    for x, y in zip(rows, rows_b, strict=True):
        for k in ("loss/total", "loss/entropy", "rollout/generated_tokens", "health/streak/dead"):
            assert x[k] == y[k], k
    assert (tmp_path / "b" / RECORDS).read_text() == (tmp_path / "a" / RECORDS).read_text().replace(
        str(tmp_path / "a"), str(tmp_path / "b"))



def test_the_step_0_checkpoint_of_rollback_leaves_the_run_as_it_was(tiny_path, tmp_path):
    """on_collapse=rollback saves step 0 before the first update. torch's optimizer state-dict helpers give a
    fresh AdamW a state by running one zero-gradient step, which counted as a step: Adam's first real update
    then used the second step's bias corrections, and the run differed from the one with the guard at warn
    (seen in the context demo from step 2 on). With an entropy bonus every step's update moves the weights
    (the random model's reward is always 0); nothing acts (only the likelihood alarm guards, and no
    trajectory is right), so both runs must train the same weights, and so must a run resumed from the
    step-0 checkpoint (its optimizer starts fresh again)."""
    import shutil

    from safetensors.torch import load_file

    extra = {"algorithm.entropy_coef": "0.05", "health.guard": "[likelihood]"}
    warn = Trainer(assemble(_cfg(tiny_path, tmp_path / "w", 2, "warn", **extra)))
    warn.fit()
    guarded = Trainer(assemble(_cfg(tiny_path, tmp_path / "r", 2, "rollback", **extra)))
    guarded.fit()
    ckpts = tmp_path / "r" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000000", "step_000001", "step_000002"]
    a, b = warn.model.state_dict(), guarded.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(ckpts / "step_000000" / "model.safetensors")
    assert any(not torch.equal(a[k], v) for k, v in start.items() if k in a)  # the updates moved the weights
    shutil.copytree(tmp_path / "r", tmp_path / "r0")
    for name in ("step_000001", "step_000002"):
        shutil.rmtree(tmp_path / "r0" / "checkpoints" / name)
    (tmp_path / "r0" / "checkpoints" / "latest").write_text("step_000000\n")
    again = Trainer(assemble(_cfg(tiny_path, tmp_path / "r0", 2, "rollback", **extra), resume=True))
    again.fit()
    assert again.model is not guarded.model
    assert all(torch.equal(a[k], again.model.state_dict()[k]) for k in a)


def test_trainer_restore_puts_weights_loop_state_rng_and_stream_back(tiny_path, tmp_path):
    """Trainer.restore (the guard's rollback) on its own: save step 0, run one step, restore step 0 with the
    learning rate halved: the initial weights, step 0 at data position 0 with no best, the health trends of
    step 0 (the rollback count untouched), the RNG as saved, the task stream from its start, the learning rate
    x 0.5."""
    trainer = Trainer(assemble(_cfg(tiny_path, tmp_path / "r", 3, "warn")))
    try:
        trainer.sync(first=True)
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        fresh = task_stream(trainer.cfg, 0, trainer.parts.tasks)
        first_tasks = [next(fresh).task_id for _ in range(2)]
        torch.manual_seed(7)
        path = trainer.save()
        saved_draw = torch.rand(3)
        metrics = trainer.train_step()
        trainer.state.step += 1
        trainer.health.observe(metrics)
        trainer.health.rollbacks = 3
        assert trainer.state.position == 2 and trainer.health.rewards
        assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())

        trainer.restore(path, verify_checkpoint(path), 0.5)
        assert (trainer.step, trainer.state.position, trainer.state.best) == (0, 0, None)
        assert trainer.health.rewards == [] and trainer.health.rollbacks == 3
        for k, v in trainer.model.state_dict().items():
            assert torch.equal(before[k], v), k
        assert torch.equal(torch.rand(3), saved_draw)  # the RNG as the checkpoint saved it
        assert [t.task_id for t in trainer._next_tasks(2)] == first_tasks
        assert trainer.parts.workers.opt.param_groups[0]["lr"] == 0.5e-3  # no warm-up: the peak, halved
    finally:
        trainer.close()
