"""Issue 49: what a careless or hostile user does that used to finish "fine" while something was lost,
wrong or exposed. Each test failed on the code before its fix; every refusal is one line naming the thing."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import make_trainer, one_line

from memrl.cli import main
from memrl.config import ConfigError, check_config, load_config
from memrl.errors import UserError
from memrl.training.config import TrainConfig


# ------------------------------------------------------------------ 1. nan / inf in float fields, diverged steps
@pytest.mark.parametrize(("override", "field", "shown"), [
    ("optim.lr=inf", "optim.lr", "inf"),
    ("optim.weight_decay=inf", "optim.weight_decay", "inf"),
    ("algorithm.kl_coef=inf", "algorithm.kl_coef", "inf"),
    ("algorithm.entropy_coef=nan", "algorithm.entropy_coef", "nan"),
    ("optim.grad_clip=-inf", "optim.grad_clip", "-inf"),
    ("val.top_p=nan", "val.top_p", "nan"),
])
def test_float_fields_refuse_nan_and_inf_by_name(override, field, shown, tmp_path, capsys):
    argv = ["train", "--preset", "demo_cpu", f"out_dir={tmp_path / 'run'}", override]
    assert main(argv) == 2
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: {field}={shown} is not allowed: must be a finite number (not nan or inf)")
    assert not (tmp_path / "run").exists()


def test_inf_in_a_preset_and_in_a_config_built_in_code(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text("inherit: demo_cpu\noptim:\n  lr: .inf\n", encoding="utf-8")
    assert main(["train", "--preset", str(preset), "model.path=x"]) == 2
    assert one_line(capsys.readouterr().err) == (
        "memrl train: error: optim.lr=inf is not allowed: must be a finite number (not nan or inf)")
    cfg = load_config(TrainConfig, [], preset="demo_cpu")
    built = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, kl_coef=math.inf))
    with pytest.raises(ConfigError, match=r"^algorithm\.kl_coef=inf is not allowed: must be a finite number"):
        check_config(built)
    # a float field without a declared range (sft's lr floor is declared; a workflow's float is checked too)
    with pytest.raises(ConfigError, match=r"^workflow\.temperature=nan is not allowed: must be a finite number"):
        from memrl.training.assemble import validate
        validate(load_config(TrainConfig, ["model.path=x", "workflow.temperature=nan",
                                           "algorithm.temperature=1.0"], preset="demo_cpu"))


def test_non_finite_loss_stops_the_run_in_one_line_and_saves_nothing(tiny_model, tmp_path, monkeypatch):
    import memrl.training.workers as workers

    real = workers.ppo_micro_loss

    def poisoned(*args, **kwargs):
        part = real(*args, **kwargs)
        part.loss = part.loss * math.nan
        return part

    monkeypatch.setattr(workers, "ppo_micro_loss", poisoned)
    out = tmp_path / "run"
    trainer = make_trainer(tiny_model, out)
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(UserError) as e:
        trainer.fit()
    assert str(e.value) == ("step 1: training diverged (loss/total=nan, train/grad_norm=nan); "
                            "stopped without saving this step (lower optim.lr or check the rewards and advantages)")
    assert not list((out / "checkpoints").glob("step_*"))
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a diverged step changed the weights"
