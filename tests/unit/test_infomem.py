"""InfoMem's final-memory reward: the gain, its normalization over a group's successes, the mix with the
outcome (hand-computed), and the registered function's batching against a scripted scorer."""

from __future__ import annotations

import pytest

from memrl.algorithms.base import register_model_reward
from memrl.config import ConfigError, load_config
from memrl.rewards.memory_gain import InfoMemOptions, infomem_reward, mean_gain, mix, normalized
from memrl.rewards.model_scored import ModelScored
from memrl.rewards.registry import model_reward_names, score_with
from memrl.training.config import TrainConfig
from memrl.types import Group, Segment, Task, Trajectory


def test_mean_gain_is_a_per_token_difference():
    # with memory: mean(-0.5, -1.5) = -1.0; without: mean(-2, -4) = -3.0; gain = 2.0
    assert mean_gain([-0.5, -1.5], [-2.0, -4.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="need the same"):
        mean_gain([-1.0], [-1.0, -2.0])


def test_normalizations():
    # minmax of [1, 3, 2]: (g - 1) / 2 -> [0, 1, 0.5]; all equal -> 0
    assert normalized([1.0, 3.0, 2.0], "minmax") == pytest.approx([0.0, 1.0, 0.5])
    assert normalized([2.0, 2.0], "minmax") == [0.0, 0.0]
    # zscore of [1, 3, 2]: mean 2, unbiased var (1 + 1 + 0) / 2 = 1 -> [-1, 1, 0] / (1 + eps)
    assert normalized([1.0, 3.0, 2.0], "zscore", eps=0.0) == pytest.approx([-1.0, 1.0, 0.0])
    assert normalized([5.0], "zscore") == [0.0]
    assert normalized([0.7, -0.2], "none") == [0.7, -0.2]


def test_mix_only_successes_get_the_bonus():
    # outcomes [1, 0, 1, 1], gains [0.2, None (a failure), 1.0, 0.6]: minmax over 0.2, 1.0, 0.6 -> 0, 1, 0.5
    # coef 0.5: [1 + 0, 0, 1 + 0.5, 1 + 0.25]
    assert mix([1, 0, 1, 1], [0.2, None, 1.0, 0.6], 0.5, "minmax") == pytest.approx([1.0, 0.0, 1.5, 1.25])
    # zscore: mean 0.6, var ((-.4)^2 + .4^2 + 0) / 2 = 0.16, std 0.4 -> [-1, 1, 0]; coef 0.5 -> [0.5, 0, 1.5, 1]
    assert mix([1, 0, 1, 1], [0.2, None, 1.0, 0.6], 0.5, "zscore", eps=0.0) == pytest.approx([0.5, 0.0, 1.5, 1.0])


def _group(task_id: str, rewards: list[float]) -> Group:
    trajs = []
    for k, r in enumerate(rewards):
        # the final segment's prompt ends with the trajectory's "memory" token 100 + k
        final = Segment([1, 2, 100 + k], [9], [-0.1], step=1, info={"kind": "final"})
        trajs.append(Trajectory(task_id, f"{task_id}#{k}", [final], reward=r))
    return Group(task_id, trajs, Task(task_id, "q", "c", ["gold"]))


class _Tok:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        assert not add_special_tokens
        return [ord(c) for c in text]


def test_infomem_reward_scores_successes_in_one_batch():
    calls: list[list[Segment]] = []

    def scorer(rows):
        calls.append(list(rows))
        # logprob of every answer token: -1 after a memory prompt (ends with 100 + k), -(1 + k) without (ends with 0)
        return [[-1.0 if r.prompt_ids[-1] >= 100 else -3.0 - (r.prompt_ids[-2] - 1)] * len(r.response_ids)
                for r in rows]

    def prompts(task, traj):
        final = traj.segments[-1].prompt_ids
        k = final[-1] - 100
        return final, [1 + k, 0]  # "no memory": a prompt carrying k for the scripted scorer

    g = _group("t", [1.0, 0.0, 1.0])
    out = infomem_reward([g], scorer=scorer, memory_prompts=prompts, tokenizer=_Tok(), coef=0.5, normalize="minmax",
                         answer_template="<{answer}>")
    # one scorer call, 2 rows per success (trajectories 0 and 2), answer "<gold>" = 6 tokens
    assert len(calls) == 1 and len(calls[0]) == 4
    assert calls[0][0].response_ids == [ord(c) for c in "<gold>"]
    # gains: k=0: -1 - (-3) = 2; k=2: -1 - (-5) = 4; minmax -> 0, 1; rewards [1, 0, 1.5]
    assert out.values == [[pytest.approx(2.0), None, pytest.approx(4.0)]]
    assert out.rewards == [[pytest.approx(1.0), 0.0, pytest.approx(1.5)]]
    # tokens: rows of 3 + 6 (with memory) and 2 + 6 (without), twice: 2 * (9 + 8) = 34
    assert out.metrics == {"infomem/scored": 2.0, "infomem/tokens": 34.0, "infomem/gain_mean": pytest.approx(3.0),
                           "infomem/bonus_mean": pytest.approx(0.25)}
    with pytest.raises(ValueError, match="needs a workflow with a final memory"):
        infomem_reward([g], scorer=scorer, memory_prompts=None, tokenizer=_Tok())


def test_config_names_and_refusals():
    assert model_reward_names()[:2] == ["none", "infomem"]
    cfg = load_config(TrainConfig, ["algorithm.model_reward=infomem", "algorithm.infomem.normalize=zscore",
                                    "model.path=x"])
    assert cfg.algorithm.model_reward_options() == InfoMemOptions(normalize="zscore")
    with pytest.raises(ConfigError, match="algorithm.infomem.normalize"):
        load_config(TrainConfig, ["algorithm.infomem.normalize=rank", "model.path=x"])
    with pytest.raises(ConfigError, match="algorithm.infomem.coef"):
        load_config(TrainConfig, ["algorithm.infomem.coef=-1", "model.path=x"])
    with pytest.raises(ConfigError, match=r"answer_template must contain \{answer\}"):
        load_config(TrainConfig, ["algorithm.infomem.answer_template=x", "model.path=x"])


# a user's own model-scored reward, registered and named by import path
@register_model_reward("length_bonus_test")
def length_bonus(groups, *, scorer, memory_prompts, tokenizer):
    rewards = [[float(t.reward) + 0.1 * len(t.segments) for t in g.trajectories] for g in groups]
    return ModelScored(rewards, [[None] * len(g.trajectories) for g in groups], {"length_bonus_test/n": 1.0})


def test_a_plugin_model_reward_by_import_path():
    name = f"{__name__}:length_bonus"
    cfg = load_config(TrainConfig, [f"algorithm.model_reward={name}", "model.path=x"])
    cfg.check()
    out = score_with(name, cfg.algorithm.model_reward_options(), [_group("t", [1.0, 0.0])], None, None, None)
    assert out.rewards == [[pytest.approx(1.1), pytest.approx(0.1)]]
    with pytest.raises(ConfigError, match="is not a registered model-scored reward"):
        load_config(TrainConfig, [f"algorithm.model_reward={__name__}:mix", "model.path=x"]).check()
