"""`memrl train` with an advantage estimator and a policy loss from a user's module, named by import path,
their options set as algorithm.<registered name>.<field> (tests/plugins_example/estimators.py): one RL step
on the tiny model, and the option shows in the logged advantages."""

from __future__ import annotations

import json

import pytest
import yaml
from plugins_example import ESTIMATORS, registry_restored  # noqa: F401 - the fixture

from memrl.cli import main

EST = ESTIMATORS
pytestmark = pytest.mark.usefixtures("registry_restored")



@pytest.mark.slow
def test_memrl_train_runs_a_plugin_estimator_and_loss_with_their_options(tmp_path):
    from memrl.models.tiny import cached_tiny_model

    model = str(cached_tiny_model("tiny"))
    run = tmp_path / "train"
    argv = ["train", f"model.path={model}", f"out_dir={run}", "data.synthetic.num_chunks=2",
            "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2", "optim.lr=1e-3",
            "optim.warmup_steps=0", "trainer.save_every=0", "trainer.progress=false", "trainer.tensorboard=false",
            "engine.name=hf", "trainer.steps=1",
            f"algorithm.name={EST}:scaled_grpo", "algorithm.scaled_grpo.scale=0.5", "algorithm.scaled_grpo.offset=3.0",
            f"algorithm.loss={EST}:clipped_ppo", "algorithm.clipped_ppo.clip=0.1"]
    assert main(argv) == 0
    [m] = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    # GRPO's values are mean-centred per group and every trajectory of a group has as many segments (the same
    # document), so their mean over segments is 0: the logged mean is the estimator's offset option
    assert m["advantage/mean"] == pytest.approx(3.0, abs=1e-6)
    assert 3.0 - 0.5 <= m["advantage/min"] <= m["advantage/max"] <= 3.0 + 0.5  # GRPO's |A| <= 1, times scale
    saved = yaml.safe_load((run / "config.yaml").read_text())["algorithm"]
    assert saved["name"] == f"{EST}:scaled_grpo" and saved["loss"] == f"{EST}:clipped_ppo"
    assert saved["plugins"] == {"scaled_grpo": {"scale": 0.5, "offset": 3.0}, "clipped_ppo": {"clip": 0.1}}
