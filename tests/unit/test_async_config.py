"""rollout.max_staleness: what cannot overlap is refused in one line, naming the fields, before any work."""

from __future__ import annotations

import pytest

from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig


def _check(*ov: str) -> None:
    load_config(TrainConfig, ["model.path=m", *ov]).check()


@pytest.mark.parametrize(("ov", "msg"), [
    ((), "rollout.max_staleness=1 needs engine.hf.share_weights=false (or Ray replicas, rollout.num_engines >= 1): "
         "an engine that shares the trained module would sample from weights the update is changing"),
    (("engine.name=vllm",), "rollout.max_staleness=1 with the in-process vllm engine: put vLLM in Ray replicas "
                            "(rollout.num_engines >= 1, rollout.engine=vllm), where it samples while the trainer updates"),
    (("rollout.num_engines=1", "rollout.colocate=true", "trainer.num_workers=1"),
     "rollout.max_staleness=1 needs rollout.colocate=false: colocated engines give their memory to the update, "
     "so nothing can sample while it runs"),
])
def test_refused(ov, msg):
    with pytest.raises(ConfigError) as e:
        _check("rollout.max_staleness=1", *ov)
    assert str(e.value) == msg


@pytest.mark.parametrize("ov", [
    ("engine.hf.share_weights=false",),
    ("rollout.num_engines=1",),
    ("engine.name=openai", "engine.openai.base_url=http://127.0.0.1:1/v1", "engine.model=m"),
    ("engine.hf.share_weights=false", "rollout.partial=abort", "rollout.partial_max_aborts=3"),
])
def test_accepted(ov):
    _check("rollout.max_staleness=2", *ov)


def test_ranges():
    with pytest.raises(ConfigError, match="rollout.max_staleness"):
        load_config(TrainConfig, ["rollout.max_staleness=-1"])
    with pytest.raises(ConfigError, match="rollout.partial"):
        load_config(TrainConfig, ["rollout.partial=drop"])
