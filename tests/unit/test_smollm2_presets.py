"""The two RL stages of the real-model recipe as presets: each is the command line that was measured
(docs/results/real_model.md, the eighth recipe: smollm2_memagent_cpu plus the --rl overrides), value for value."""

from __future__ import annotations

import dataclasses

from memrl.config import load_config
from memrl.training.config import TrainConfig

# the eighth recipe's --rl values, as run (both stages; benchmarks/real_model_rl.py put them after the preset)
MEASURED = ["trainer.batch_size=4", "optim.lr=2e-4", "algorithm.name=rememr1", "algorithm.rememr1.alpha=0.5",
            "algorithm.rememr1.norm_by_std=true", "algorithm.temperature=0.7", "trainer.prefix_sharing=auto",
            "trainer.token_budget=2048", "trainer.save_every=4", "trainer.keep_checkpoints=1"]


def _measured(reward: str, steps: int) -> TrainConfig:
    return load_config(TrainConfig, [*MEASURED, f"workflow.reward={reward}", f"workflow.final_step_reward={reward}",
                                     f"trainer.steps={steps}"], preset="smollm2_memagent_cpu")


def test_the_box_stage_is_the_measured_first_stage():
    cfg = load_config(TrainConfig, [], preset="smollm2_memagent_box_cpu")
    assert cfg == _measured("format_f1", 24)
    assert (cfg.algorithm.name, cfg.algorithm.temperature, cfg.trainer.batch_size, cfg.algorithm.n) == (
        "rememr1", 0.7, 4, 8)


def test_the_answer_stage_is_the_measured_second_stage():
    cfg = load_config(TrainConfig, [], preset="smollm2_memagent_answer_cpu")
    assert cfg == _measured("published_box_f1", 16)
    # and differs from the first stage only in the reward and the number of steps
    a = dataclasses.asdict(load_config(TrainConfig, [], preset="smollm2_memagent_box_cpu"))
    b = dataclasses.asdict(cfg)
    assert (b["workflow"]["reward"], b["workflow"]["final_step_reward"], b["trainer"]["steps"]) == (
        "published_box_f1", "published_box_f1", 16)
    for d in (a, b):
        d["workflow"].pop("reward"), d["workflow"].pop("final_step_reward"), d["trainer"].pop("steps")
    assert a == b
