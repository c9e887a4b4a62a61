"""Training health (memrl.training.monitor.health) and the guard's file helpers (memrl.training.monitor.guard), by hand."""

from __future__ import annotations

import json

import pytest

from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig
from memrl.training.monitor.guard import drop_after, good_checkpoint, read_records, record, truncate_records
from memrl.training.monitor.health import HealthMonitor, HealthSection, rollout_health, slope
from memrl.training.step.rollout import RolloutResult
from memrl.types import Group, Segment, Trajectory


def _traj(tid: str, reward: float, lps: list[float], mask: list[int] | None = None, finish: str | None = None,
          **metrics: float) -> Trajectory:
    info = {"finish_reason": finish} if finish else {}
    seg = Segment([1], list(range(len(lps))), lps, loss_mask=mask, info=info)
    return Trajectory("t", tid, [seg], reward=reward, metrics=dict(metrics))


def test_rollout_health_by_hand():
    g1 = Group("t", [_traj("1", 1.0, [-0.5, -1.5], finish="stop", no_box=0.0),
                     _traj("2", 0.0, [-3.0], finish="length", no_box=1.0)])
    g2 = Group("t", [_traj("3", 1.0, [-1.0, -9.0], mask=[1, 0], finish="stop", no_box=0.0),
                     _traj("4", 1.0, [-2.0], finish="stop", no_box=0.0)])
    res = RolloutResult([g1, g2], sampled_groups=3, dropped_groups=1, all_rewards=[1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    out = rollout_health(res, format_keys=("no_box",))
    assert out["health/format_failure_share"] == 1 / 4  # trajectory 2 only
    assert out["health/truncation_share"] == 1 / 4  # trajectory 2 ended at its token budget
    assert out["health/zero_variance_share"] == 2 / 3  # g2 (1, 1) and the dropped group, of 3 sampled
    assert out["health/reward_mean"] == 0.5 and out["health/reward_max"] == 1.0
    # right trajectories 1, 3, 4: tokens -0.5, -1.5, -1.0 (the -9.0 is masked), -2.0 -> mean -5/4
    assert out["health/right_logprob"] == -1.25


def test_rollout_health_leaves_out_what_a_workflow_does_not_record():
    out = rollout_health(RolloutResult([Group("t", [_traj("1", 0.0, [-1.0])])], sampled_groups=1, all_rewards=[0.0]),
                         format_keys=())
    assert set(out) == {"health/zero_variance_share", "health/reward_mean", "health/reward_max"}
    overlong = _traj("2", 0.0, [-1.0])
    overlong.info["overlong"] = True
    res = RolloutResult([Group("t", [overlong])], sampled_groups=1, all_rewards=[0.0])
    assert rollout_health(res, ())["health/truncation_share"] == 1.0


def test_slope_is_the_least_squares_line():
    assert slope([1.0]) == 0.0
    assert slope([0.0, 1.0, 2.0]) == 1.0
    # x = 0..3 (mean 1.5), y = 1, 3, 2, 6 (mean 3): sum (x - 1.5)(y - 3) = 3 + 0 - 0.5 + 4.5 = 7,
    # sum (x - 1.5)^2 = 5: slope 1.4
    assert slope([1.0, 3.0, 2.0, 6.0]) == pytest.approx(1.4)


def test_monitor_streaks_fire_at_patience_and_end():
    m = HealthMonitor(HealthSection(patience=2, window=2, likelihood_tol=0.1))
    dead = {"health/zero_variance_share": 1.0, "health/reward_max": 0.0, "health/reward_mean": 0.0}
    assert m.observe(dict(dead)) == []
    fired = m.observe(dict(dead))
    assert [a.name for a in fired] == ["dead"] and fired[0].streak == 2
    live = {"health/zero_variance_share": 1.0, "health/reward_max": 1.0, "health/reward_mean": 1.0}
    step = dict(live)
    assert m.observe(step) == [] and step["health/streak/dead"] == 0.0  # a reward above dead_reward ends it
    assert step["health/reward_trend"] == 1.0  # window 2: rewards 0 then 1
    # every outcome 0, but process rewards gave some rows a token-level advantage: the update has a gradient
    shaped = dict(dead, **{"advantage/min": 0.0, "advantage/max": 0.1115})
    assert m.observe(dict(shaped)) == [] and m.observe(dict(shaped)) == [] and m.streaks["dead"] == 0
    assert [a.name for a in (m.observe(dict(dead, **{"advantage/min": 0.0, "advantage/max": 0.0})),
                             m.observe(dict(dead)))[1]] == ["dead"]
    # likelihood: -1.0, then -1.05 (fell by less than the 0.1 tolerance), -1.2, -1.4 (fell twice): fires
    seq = [-1.0, -1.05, -1.2, -1.4]
    out = [m.observe({"health/right_logprob": x}) for x in seq]
    assert [o for o in out[:3]] == [[], [], []] and [a.name for a in out[-1]] == ["likelihood"]
    assert m.streaks["likelihood"] == 2
    steps = [{"health/right_logprob": -2.0}]
    m.observe(steps[0])
    assert steps[0]["health/right_logprob_delta"] == pytest.approx(-2.0 - (-1.2 + -1.4) / 2)  # window 2
    m.observe({})  # no right trajectory: the streak ends
    assert m.streaks["likelihood"] == 0
    fmt = {"health/format_failure_share": 0.6}
    m.observe(dict(fmt))
    assert [a.name for a in m.observe(dict(fmt))] == ["format"]
    assert m.observe({"health/format_failure_share": 0.5}) == []  # not above 0.5


def test_monitor_state_round_trips_and_rollback_keeps_its_count():
    m = HealthMonitor(HealthSection())
    m.observe({"health/reward_mean": 0.25, "health/right_logprob": -1.0, "health/zero_variance_share": 1.0,
               "health/reward_max": 0.0})
    m.rollbacks = 1
    saved = json.loads(json.dumps(m.saved()))
    assert saved == {"rewards": [0.25], "right": [-1.0], "last_right": -1.0,
                     "streaks": {"dead": 1, "format": 0, "likelihood": 0}, "rollbacks": 1}
    other = HealthMonitor(HealthSection())
    other.rollbacks = 2
    other.restore(saved, keep_rollbacks=True)
    assert other.saved() == {**saved, "rollbacks": 2}
    other.restore(saved)
    assert other.rollbacks == 1


def _ckpt(root, step: int) -> None:
    import torch

    from memrl.training.checkpoints.checkpoint import STATE_FILE

    d = root / f"step_{step:06d}"
    d.mkdir(parents=True)
    torch.save({"scheduler": {}, "rng": {}, "step": step, "data_position": 2 * step, "optimizer": {}}, d / STATE_FILE)
    (d / "model.safetensors").write_bytes(b"")


def test_good_checkpoint_and_drop_after(tmp_path, monkeypatch):
    import memrl.training.monitor.guard as guard

    monkeypatch.setattr(guard, "verify_checkpoint", lambda p: {"step": int(p.name[5:])})
    for s in (0, 2, 4):
        _ckpt(tmp_path, s)
    assert good_checkpoint(tmp_path, 4)[0].name == "step_000002"
    assert good_checkpoint(tmp_path, 5)[0].name == "step_000004"
    assert good_checkpoint(tmp_path, 0) is None
    assert drop_after(tmp_path, tmp_path / "step_000000") == ["step_000002", "step_000004"]
    assert (tmp_path / "latest").read_text() == "step_000000\n"
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000000"]


def test_records_truncate_to_the_resumed_rollback_count(tmp_path):
    for r in (1, 2):
        record(tmp_path, {"event": "rollback", "rollback": r, "step": 3 * r})
    assert truncate_records(tmp_path, 2) == 0
    assert truncate_records(tmp_path, 1) == 1
    assert read_records(tmp_path) == [{"event": "rollback", "rollback": 1, "step": 3}]


@pytest.mark.parametrize("extra, message", [
    (["trainer.on_collapse=panic"], "trainer.on_collapse"),
    (["health.guard=[dead,boredom]"], "health.guard"),
    (["health.patience=0"], "health.patience"),
    (["health.format_share=1.5"], "health.format_share"),
    (["health.rollback_lr_scale=0"], "health.rollback_lr_scale"),
    (["trainer.on_collapse=rollback", "trainer.save_every=0"],
     "trainer.on_collapse=rollback does not support trainer.save_every=0 (no checkpoint to go back to)"),
    (["trainer.on_collapse=rollback", "trainer.num_workers=2", "rollout.num_engines=1"],
     "trainer.on_collapse=rollback does not support trainer.num_workers > 1"),
    (["trainer.on_collapse=rollback", "trainer.save_every=1", "trainer.keep_checkpoints=2"],
     "trainer.keep_checkpoints=2 must be > 3 with trainer.on_collapse=rollback, trainer.save_every=1 and "
     "health.patience=3"),
])
def test_bad_settings_are_one_line_errors_naming_the_field(extra, message, tmp_path):
    from memrl.config import check_config

    with pytest.raises(ConfigError) as e:
        cfg = load_config(TrainConfig, [f"model.path={tmp_path}", *extra])
        check_config(cfg)
        cfg.check()
    assert message in str(e.value) and "\n" not in str(e.value)
