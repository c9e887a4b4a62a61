"""model.lora.* and rollout.sync_check*: defaults, ranges, and the LoRA presets that inherit the published runs."""

from __future__ import annotations

import pytest

from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig

OFFICIAL = ["memagent_official", "rememr1_official", "memact_official"]


def test_defaults_are_off():
    cfg = load_config(TrainConfig, [])
    assert cfg.model.lora.rank == 0 and cfg.model.lora.alpha == 16.0 and cfg.model.lora.dropout == 0.0
    assert cfg.model.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"]
    assert cfg.model.lora.save_merged is False
    assert cfg.rollout.sync_check is False and cfg.rollout.sync_check_tol == 1e-3
    assert cfg.rollout.sync_check_tokens == 4


@pytest.mark.parametrize(("override", "field"), [
    ("model.lora.rank=-1", "model.lora.rank"), ("model.lora.alpha=0", "model.lora.alpha"),
    ("model.lora.dropout=1", "model.lora.dropout"), ("rollout.sync_check_tol=0", "rollout.sync_check_tol"),
    ("rollout.sync_check_tokens=0", "rollout.sync_check_tokens"),
])
def test_out_of_range_values_fail_naming_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, [override])
    assert field in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", OFFICIAL)
def test_lora_presets_are_the_official_ones_plus_lora(name):
    import dataclasses

    base = load_config(TrainConfig, [], preset=name)
    lora = load_config(TrainConfig, [], preset=f"{name}_lora")
    assert (lora.model.lora.rank, lora.model.lora.alpha, lora.model.lora.save_merged) == (32, 64.0, True)
    assert lora.optim.lr == 1e-5 and base.optim.lr == 1e-6
    # every other value is the published run's
    a, b = dataclasses.asdict(base), dataclasses.asdict(lora)
    a["model"].pop("lora"), b["model"].pop("lora"), a["optim"].pop("lr"), b["optim"].pop("lr")
    assert a == b


def test_inherit_loops_and_bad_parents_fail_in_one_line(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"inherit: {b}\n", encoding="utf-8")
    b.write_text(f"inherit: {a}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="`inherit` loops"):
        load_config(TrainConfig, [], preset=str(a))
    a.write_text("inherit: no_such_preset\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown preset 'no_such_preset'"):
        load_config(TrainConfig, [], preset=str(a))


def test_lora_with_fsdp_ranks_and_the_sync_check_pass_the_checks():
    """LoRA and rollout.sync_check under FSDP2 ranks (tests/integration/test_lora_fsdp.py) are accepted."""
    from memrl.training.assemble import validate

    cfg = load_config(TrainConfig, ["model.path=m", "model.lora.rank=8", "trainer.num_workers=2",
                                    "rollout.num_engines=1", "rollout.sync_check=true"])
    validate(cfg)
    assert (cfg.model.lora.rank, cfg.trainer.num_workers, cfg.rollout.sync_check) == (8, 2, True)
