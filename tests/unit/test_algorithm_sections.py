"""Algorithm options nest under the estimator or loss they belong to (`algorithm.rememr1.alpha`), the old
flat keys fail with one line naming the new one, and an estimator or loss with options can come from a
user's module by import path (tests/plugins_example/estimators.py)."""

from __future__ import annotations

import pytest
import yaml
from plugins_example import ESTIMATORS, registry_restored  # noqa: F401 - the fixture

from memrl.cli import main
from memrl.config import ConfigError, load_config, to_yaml
from memrl.training.algorithm_section import FLAT_OPTIONS
from memrl.training.config import TrainConfig

EST = ESTIMATORS
pytestmark = pytest.mark.usefixtures("registry_restored")



def _options(*overrides: str):
    return load_config(TrainConfig, ["model.path=x", *overrides]).algorithm.options()


def test_options_nest_under_their_estimator_and_loss():
    from memrl.algorithms.options import DCPOOptions, GRPOOptions, PPOOptions, ReMemR1Options

    assert _options() == (GRPOOptions(), PPOOptions())
    adv, loss = _options("algorithm=rememr1", "algorithm.rememr1.alpha=0.5", "algorithm.ppo.clip_high=0.28")
    assert adv == ReMemR1Options(alpha=0.5) and loss == PPOOptions(clip_high=0.28)
    assert _options("algorithm=dcpo", "algorithm.dcpo.eps=0.5")[0] == DCPOOptions(eps=0.5)
    # another estimator's section is kept but not used (as a flat alpha was under grpo)
    assert _options("algorithm.rememr1.alpha=0.5")[0] == GRPOOptions()


@pytest.mark.parametrize("old", sorted(FLAT_OPTIONS))
def test_the_flat_spelling_fails_naming_the_new_key(old, capsys):
    assert main(["train", "model.path=x", f"algorithm.{old}=0.5"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert f"algorithm.{old} (set by an override) was removed" in err[0]
    assert all(f"algorithm.{s}.{old}" in err[0] for s in FLAT_OPTIONS[old])


def test_a_preset_with_a_flat_key_fails_naming_the_new_key(tmp_path):
    p = tmp_path / "old.yaml"
    p.write_text("algorithm:\n  name: rememr1\n  alpha: 0.5\n")
    with pytest.raises(ConfigError, match=r"^algorithm\.alpha \(set by preset .*old\.yaml\) was removed: .*"
                                          r"set algorithm\.rememr1\.alpha$"):
        load_config(TrainConfig, ["model.path=x"], preset=str(p))


def test_the_value_in_force_reads_under_the_old_name():
    a = load_config(TrainConfig, ["model.path=x", "algorithm=rememr1", "algorithm.rememr1.alpha=0.5"]).algorithm
    assert (a.alpha, a.norm_by_std, a.clip_low) == (0.5, False, 0.2)
    with pytest.raises(AttributeError, match="algorithm.credit: neither algorithm.name=rememr1"):
        a.credit  # noqa: B018 - grpo's option, not rememr1's


def test_a_plugin_estimator_and_loss_by_import_path_get_their_options(tmp_path):
    from plugins_example.estimators import ClippedPPOOptions, ScaledGRPOOptions

    ov = [f"algorithm.name={EST}:scaled_grpo", "algorithm.scaled_grpo.scale=0.25",
          f"algorithm.loss={EST}:clipped_ppo", "algorithm.clipped_ppo.clip=0.1"]
    cfg = load_config(TrainConfig, ["model.path=x", *ov])
    assert cfg.algorithm.options() == (ScaledGRPOOptions(scale=0.25), ClippedPPOOptions(clip=0.1))
    assert _options(f"algorithm.name={EST}:scaled_grpo")[0] == ScaledGRPOOptions()  # its defaults
    # the saved config (config.yaml) loads back to the same options
    saved = yaml.safe_load(to_yaml(cfg))["algorithm"]
    assert saved["plugins"] == {"scaled_grpo": {"scale": 0.25}, "clipped_ppo": {"clip": 0.1}}
    p = tmp_path / "config.yaml"
    p.write_text(to_yaml(cfg))
    assert load_config(TrainConfig, preset=str(p)).algorithm.options() == cfg.algorithm.options()
    # a preset spells them the same way
    p.write_text(f"algorithm:\n  name: {EST}:scaled_grpo\n  scaled_grpo:\n    scale: 0.5\n")
    assert load_config(TrainConfig, ["model.path=x"], preset=str(p)).algorithm.options()[0] == ScaledGRPOOptions(0.5)


@pytest.mark.parametrize("overrides, said", [
    ([f"algorithm.name={EST}:not_registered"],
     f"algorithm.name='{EST}:not_registered' is not a registered advantage estimator (got function): only functions "
     "marked with @memrl.algorithms.base.register_advantage(name, Options) may be named (nothing was called)"),
    (["algorithm.name=memrl_no_such_module:est"], "algorithm.name='memrl_no_such_module:est': cannot import module"),
    ([f"algorithm.loss={EST}:scaled_grpo"], f"algorithm.loss='{EST}:scaled_grpo' is not a registered policy loss"),
    ([f"algorithm.name={EST}:scaled_grpo", "algorithm.scaled_grpo.scal=2"],
     "unknown key(s) algorithm.scaled_grpo.scal for ScaledGRPOOptions"),
    ([f"algorithm.name={EST}:scaled_grpo", "algorithm.scaled_grpo.scale=-1"],
     "algorithm.scaled_grpo.scale=-1.0 is not allowed: must be > 0"),
    (["algorithm.scaled_grpo.scale=2"], "algorithm.scaled_grpo sets options of 'scaled_grpo', which is neither the "
                                        "estimator, the loss nor the model-scored reward in use (algorithm.name=grpo: "
                                        "grpo"),
    (["algorithm.name=nope"], "algorithm.name='nope' is not allowed: must be one of dcpo, foldgrpo, grpo, reinforce_pp, "
                              "reinforce_pp_baseline, rememr1, rloo"),
])
def test_bad_algorithm_names_and_sections_are_one_line_naming_the_field(overrides, said, capsys):
    assert main(["train", "model.path=x", *overrides]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and said in err[0], err
