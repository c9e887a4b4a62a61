"""What involves several fields is checked next to them: each section of memrl.training.config has a
`check()` (TrainConfig.check() runs them all, then what spans sections), and `validate` runs it with the
same one-line messages it always gave."""

from __future__ import annotations

import pytest

from memrl.config import ConfigError, load_config
from memrl.training.assemble import validate
from memrl.training.config import (
    AlgorithmSection,
    DataSection,
    ModelSection,
    RolloutSection,
    TrainConfig,
    TrainerSection,
)

CASES = [
    (AlgorithmSection(name="dcpo", n=1), ["algorithm=dcpo", "algorithm.n=1"],
     "algorithm.n must be >= 2 with algorithm.name=dcpo (its advantage divides by the group's std, which one "
     "trajectory does not have), got 1"),
    (AlgorithmSection(selection="published", n=8, segments_per_task=4),
     ["algorithm.selection=published", "algorithm.n=8", "algorithm.segments_per_task=4"],
     "algorithm.segments_per_task=4 must be >= algorithm.n=8 with algorithm.selection=published (every trajectory "
     "trains at least one row; the public sampler asserts the same)"),
    (TrainerSection(mini_batch_rows=4, mini_batches=2), ["trainer.mini_batch_rows=4",
                                                                      "trainer.mini_batches=2"],
     "trainer.mini_batch_rows=4 (a step every k rows) and trainer.mini_batches=2 both set the update schedule; "
     "set one (the other to its default)"),
    (TrainerSection(loggers=["tensorboard"]), ["trainer.loggers=[tensorboard]"],
     "trainer.loggers=['tensorboard'] must hold jsonl (metrics.jsonl is what resume and memrl view read) and "
     "each logger once"),
    (DataSection(name="file"), ["data.name=file"], "data.path is required when data.name=file"),
    (ModelSection(path=""), ['model.path=""'], "model.path is required (a HuggingFace model directory)"),
    (RolloutSection(weight_sync="directory"), ["rollout.weight_sync=directory"],
     "rollout.weight_sync=directory applies to Ray replicas: it needs rollout.num_engines >= 1 (the in-process "
     "engine shares the module or takes the state dict)"),
]


@pytest.mark.parametrize("section,overrides,message", CASES, ids=[c[2][:40] for c in CASES])
def test_each_section_checks_its_own_fields(section, overrides, message):
    with pytest.raises(ConfigError) as e:
        section.check()
    assert str(e.value) == message
    cfg = load_config(TrainConfig, ["model.path=x", *overrides])
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value) == message


def test_what_spans_sections_is_checked_by_the_train_config():
    cfg = load_config(TrainConfig, ["model.path=x", "trainer.num_workers=2"])
    with pytest.raises(ConfigError) as e:
        cfg.check()
    assert str(e.value) == ("trainer.num_workers=2 needs rollout.num_engines >= 1 (the in-process engine serves "
                            "the live module of world size 1)")
    cfg = load_config(TrainConfig, ["model.path=x", "engine=openai", "engine.openai.api=chat"])
    with pytest.raises(ConfigError, match=r"^engine.openai.api=chat cannot train: RL needs the generated token ids "
                                          r"and their sampling logprobs for the exact prompt tokens, .* set "
                                          r"engine.openai.api=completions$"):
        cfg.check()


def test_the_defaults_pass_every_check_but_the_model_path():
    TrainConfig(model=ModelSection(path="x")).check()
    AlgorithmSection().check()
    assert AlgorithmSection().options()[0].norm_by_std is False
