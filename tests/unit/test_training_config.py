"""Training config: overrides, presets, and bad input failing with the offending name."""

from __future__ import annotations

import pytest

from memrl.cli import main
from memrl.config import ConfigError, load_config
from memrl.errors import UserError
from memrl.training.assemble import assemble, validate, workflow_config
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer


def test_presets_load_and_overrides_apply():
    cfg = load_config(TrainConfig, ["workflow=memagent", "algorithm=grpo", "algorithm.n=8",
                                    "workflow.chunk_tokens=1000"], preset="memagent_grpo")
    assert cfg.algorithm.n == 8 and cfg.algorithm.kl_coef == 0.001 and cfg.optim.lr == 1e-6
    assert cfg.trainer.batch_size == 128 and cfg.workflow["chunk_tokens"] == 1000
    _, wf = workflow_config(cfg)
    assert wf.chunk_tokens == 1000 and wf.max_chunks == 8 and wf.max_memory_tokens == 1024
    demo = load_config(TrainConfig, ["model.path=x"], preset="demo_cpu")
    validate(demo)
    assert demo.engine.name == "hf" and (demo.data.synthetic.min_chunks, demo.data.synthetic.num_chunks) == (2, 8)


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="algorithm.nn"):
        load_config(TrainConfig, ["algorithm.nn=8"])


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="algorithm.n"):
        load_config(TrainConfig, ["algorithm.n=eight"])


def test_unknown_workflow_option_is_named():
    cfg = load_config(TrainConfig, ["model.path=x", "workflow.chunk_tokenz=3"])
    with pytest.raises(ConfigError, match="workflow.chunk_tokenz"):
        validate(cfg)
    cfg = load_config(TrainConfig, ["model.path=x", "workflow.chunk_tokens=many"])
    with pytest.raises(ConfigError, match="workflow"):
        validate(cfg)
    cfg = load_config(TrainConfig, ["model.path=x", "workflow.options.chunk_tokens=8"])
    with pytest.raises(ConfigError, match=r"workflow.options.<field> is now spelled workflow.<field>"):
        validate(cfg)


def test_sampling_and_training_temperature_must_agree():
    cfg = load_config(TrainConfig, ["model.path=x", "workflow.temperature=0.7"])
    with pytest.raises(ConfigError, match="algorithm.temperature"):
        validate(cfg)
    cfg = load_config(TrainConfig, ["model.path=x", "algorithm.temperature=0.7"])
    assert workflow_config(cfg)[1].temperature == 0.7


def test_bad_enum_values_are_named():
    for ov, name in [("algorithm.loss_agg=mean", "algorithm.loss_agg"), ("algorithm.name=ppo2", "algorithm.name"),
                     ("workflow=nope", "workflow.name"), ("algorithm.rememr1.alpha=1.5", "algorithm.rememr1.alpha")]:
        with pytest.raises(ConfigError, match=name):
            validate(load_config(TrainConfig, ["model.path=x", ov]))


def test_unwritable_out_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = load_config(TrainConfig, ["model.path=/does/not/exist", f"out_dir={blocker}/run"])
    with pytest.raises(UserError, match="is a file, not a directory"):
        Trainer(assemble(cfg))  # before loading the (missing) model


def test_cli_reports_bad_override(capsys):
    assert main(["train", "model.path=x", "algorithm.ppo.clip_low=wide"]) == 2  # a usage error
    assert "algorithm.ppo.clip_low" in capsys.readouterr().err


@pytest.mark.parametrize("ov,field", [
    (["algorithm.n=0"], "algorithm.n"),
    (["algorithm.n=1"], "algorithm.n must be >= 2 with algorithm.name=dcpo"),
    (["algorithm.selection=spread_unused", "algorithm.n=13"], "algorithm.segments_per_task=12 must be >= algorithm.n=13"),
    (["algorithm.selection=published", "algorithm.segments_per_task=7", "algorithm.n=8"],
     "algorithm.segments_per_task=7 must be >= algorithm.n=8"),
    (["algorithm.selection=best"], "algorithm.selection='best' is not allowed: must be one of all, published, spread_unused"),
])
def test_dcpo_bad_group_sizes_are_named(ov, field):
    with pytest.raises(ConfigError, match=field):  # a range (n >= 1) when loading, actual_n >= 2 in validate
        validate(load_config(TrainConfig, ["model.path=x", "algorithm.name=dcpo"] + ov))


def test_selection_defaults_and_segments_per_task_only_checked_with_a_selection():
    cfg = load_config(TrainConfig, ["model.path=x", "algorithm.name=dcpo", "algorithm.n=8"])
    validate(cfg)
    a = cfg.algorithm
    assert (a.selection, a.segments_per_task) == ("all", 12)  # the estimator alone selects nothing
    validate(load_config(TrainConfig, ["model.path=x", "algorithm.n=16"]))  # n > 12 is fine without a selection
    validate(load_config(TrainConfig, ["model.path=x", "algorithm.selection=published", "algorithm.n=12"]))


@pytest.mark.parametrize("ov", [["algorithm.actual_n=8"], ["+algorithm.actual_n=8"]])
def test_removed_actual_n_names_its_replacement(ov):
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, ["model.path=x"] + ov)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("algorithm.actual_n (set by an override) was removed: ")
    assert "algorithm.n" in msg and "algorithm.segments_per_task" in msg and "algorithm.selection" in msg


def test_removed_actual_n_in_a_preset_file_is_named(tmp_path):
    preset = tmp_path / "old.yaml"
    preset.write_text("algorithm:\n  name: dcpo\n  actual_n: 8\n  n: 12\n")
    with pytest.raises(ConfigError, match=f"algorithm.actual_n \\(set by preset {preset}\\) was removed"):
        load_config(TrainConfig, ["model.path=x"], preset=str(preset))


def test_switching_workflow_keeps_no_memagent_defaults():
    """`workflow=memact` trains MemAct: the chunk cap is a training default only chunked workflows get."""
    cfg = load_config(TrainConfig, ["model.path=x", "workflow=memact", "algorithm=dcpo"])
    validate(cfg)
    spec, wf = workflow_config(cfg)
    assert spec.name == "memact" and not hasattr(wf, "max_chunks")
    _, wf = workflow_config(load_config(TrainConfig, ["model.path=x"]))
    assert wf.max_chunks == 8
    _, wf = workflow_config(load_config(TrainConfig, ["model.path=x", "workflow.max_chunks=3"]))
    assert wf.max_chunks == 3


def test_memrl_presets_keep_memrls_schedule_and_official_presets_take_the_published_one():
    """memagent_grpo / _8gpu are memrl's recipe: one optimizer step per batch, shuffled epochs. The published
    schedule (run_memory_7B.sh: train_batch_size 128 / ppo_mini_batch_size 8 = 16 steps, verl's row cut,
    data.shuffle=False) is memagent_official's (tests/parity/test_train_presets.py has the whole table)."""
    for preset in ("memagent_grpo", "memagent_grpo_8gpu"):
        cfg = load_config(TrainConfig, ["model.path=x"], preset=preset)
        t = cfg.trainer
        assert (t.batch_size, t.mini_batches, t.mini_batch_split, t.mini_batch_rows) == (128, 1, "groups", 0), preset
        assert cfg.data.shuffle is True, preset
    t = load_config(TrainConfig, ["model.path=x"], preset="memagent_official").trainer
    assert (t.batch_size, t.mini_batches, t.mini_batch_split, t.mini_batch_rows) == (128, 16, "rows", 0)
    default = load_config(TrainConfig, [])
    assert (default.trainer.mini_batches, default.trainer.mini_batch_split, default.data.shuffle) == (1, "groups", True)
