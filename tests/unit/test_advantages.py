"""Advantage estimators: GRPO over trajectories, credit modes, ReMemR1's multi-level mix, DCPO, registry.

Every expected value is written out by hand (std is the unbiased one, eps = 1e-6).
"""

from __future__ import annotations

import dataclasses

import pytest

from memrl.algorithms.advantages import (
    assign_advantages,
    compute_group_advantages,
    grpo_advantages,
    rememr1_advantages,
)
from memrl.algorithms.base import register_advantage
from memrl.algorithms.registry import advantage_names, get_advantage
from memrl.types import Group, Segment, Trajectory

# Hand values below ignore eps = 1e-6 in (std + eps): that moves them by about eps / std (< 3e-6 relative).
REL = 1e-5


def seg(step: int = 0, step_reward: float | None = None, kind: str = "memory") -> Segment:
    return Segment(
        prompt_ids=[1],
        response_ids=[2],
        response_logprobs=[-0.1],
        step=step,
        step_reward=step_reward,
        info={"kind": kind},
    )


def traj(task: str, tid: str, reward: float, n_segments: int = 1) -> Trajectory:
    return Trajectory(task, tid, [seg(i) for i in range(n_segments)], reward=reward)


def test_grpo_mean_centring_only():
    # group a = [1, 0, 0, 1]: mean 0.5 -> [0.5, -0.5, -0.5, 0.5]; group b = [0, 2, 4]: mean 2 -> [-2, 0, 2]
    # ids interleaved on purpose: statistics follow the id, not the position
    rewards = [1, 0, 0, 2, 0, 1, 4]
    ids = ["a", "a", "b", "b", "a", "a", "b"]
    assert grpo_advantages(rewards, ids, norm_by_std=False) == pytest.approx([0.5, -0.5, -2, 0, -0.5, 0.5, 2])


def test_grpo_std_normalized():
    # b = [0, 2, 4]: mean 2, unbiased var = (4 + 0 + 4) / 2 = 4, std 2 -> [-2, 0, 2] / (2 + 1e-6)
    assert grpo_advantages([0, 2, 4], ["b"] * 3, norm_by_std=True) == pytest.approx([-1, 0, 1], rel=1e-6)
    assert grpo_advantages([0, 2, 4], ["b"] * 3, norm_by_std=True)[2] == pytest.approx(2 / 2.000001, rel=1e-12)
    # a = [1, 0, 0, 1]: var = 4 * 0.25 / 3 = 1/3, std = 0.5773503 -> 0.5 / 0.5773503 = 0.8660254 (= sqrt(3)/2)
    assert grpo_advantages([1, 0, 0, 1], ["a"] * 4, norm_by_std=True) == pytest.approx(
        [0.8660254, -0.8660254, -0.8660254, 0.8660254], rel=REL
    )


def test_grpo_single_member_and_zero_variance_groups():
    # a group of one gets A = r exactly (mean 0, std 1), with and without std division
    assert grpo_advantages([0.7], ["solo"], norm_by_std=True) == [0.7]
    assert grpo_advantages([0.7], ["solo"], norm_by_std=False) == [0.7]
    # all rewards equal: (1 - 1) / (0 + eps) = 0
    assert grpo_advantages([1, 1], ["same", "same"], norm_by_std=True) == [0.0, 0.0]


def test_grpo_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 rewards but 1 group ids"):
        grpo_advantages([1, 0], ["a"], norm_by_std=True)


def test_assign_advantages_broadcast_and_split():
    t1, t2 = traj("q", "t1", 1.0, n_segments=3), traj("q", "t2", 0.0, n_segments=2)
    assign_advantages([t1, t2], [0.6, -0.4], credit="broadcast")
    assert [s.advantage for s in t1.segments] == pytest.approx([0.6, 0.6, 0.6])
    assert [s.advantage for s in t2.segments] == pytest.approx([-0.4, -0.4])
    assign_advantages([t1, t2], [0.6, -0.4], credit="split")
    assert [s.advantage for s in t1.segments] == pytest.approx([0.2, 0.2, 0.2])  # 0.6 / 3
    assert [s.advantage for s in t2.segments] == pytest.approx([-0.2, -0.2])  # -0.4 / 2
    with pytest.raises(ValueError, match="unknown credit mode 'thirds'"):
        assign_advantages([t1], [1.0], credit="thirds")  # type: ignore[arg-type]


def test_compute_group_advantages_grpo_on_multi_segment_trajectories():
    g1 = Group("q1", [traj("q1", "a", 1.0, n_segments=2), traj("q1", "b", 0.0, n_segments=3)])
    g2 = Group("q2", [traj("q2", "c", 0.3, n_segments=1)])
    # g1 over TRAJECTORIES [1, 0] (not over its 5 rows): mean 0.5 -> +-0.5; g2 is a group of one -> 0.3
    out = compute_group_advantages([g1, g2], "grpo", norm_by_std=False, credit="split")
    # split: 0.5 / 2 = 0.25 on a's two rows; -0.5 / 3 = -1/6 on b's three rows
    assert out == [[pytest.approx([0.25, 0.25]), pytest.approx([-1 / 6] * 3)], [pytest.approx([0.3])]]
    assert [s.advantage for s in g1.trajectories[1].segments] == pytest.approx([-1 / 6] * 3)
    assert g2.trajectories[0].segments[0].advantage == pytest.approx(0.3)
    # with std: std([1, 0]) = sqrt(0.5) -> 0.5 / 0.7071068 = 0.7071068, broadcast to every row
    compute_group_advantages([g1], "grpo", norm_by_std=True)
    assert [s.advantage for s in g1.trajectories[0].segments] == pytest.approx([0.7071068] * 2, rel=REL)
    assert [s.advantage for s in g1.trajectories[1].segments] == pytest.approx([-0.7071068] * 3, rel=REL)


def test_groups_for_the_same_task_are_not_pooled():
    g1 = Group("q", [traj("q", "a", 1.0), traj("q", "b", 0.0)])
    g2 = Group("q", [traj("q", "c", 3.0), traj("q", "d", 1.0)])
    # each Group on its own: [1, 0] -> +-0.5 and [3, 1] -> +-1 (pooled they would use mean 1.25)
    out = compute_group_advantages([g1, g2], "grpo", norm_by_std=False)
    assert out == [[[0.5], [-0.5]], [[1.0], [-1.0]]]


def test_dcpo_is_std_normalized_grpo_broadcast_to_segments():
    g = Group(
        "q", [traj("q", "a", 1.0, 3), traj("q", "b", 0.0, 1), traj("q", "c", 0.0, 2), traj("q", "d", 0.0, 1)]
    )
    # rewards [1, 0, 0, 0]: mean 0.25, devs [0.75, -0.25, -0.25, -0.25]
    # unbiased var = (0.5625 + 3 * 0.0625) / 3 = 0.25, std 0.5 -> [1.5, -0.5, -0.5, -0.5]
    out = compute_group_advantages([g], "dcpo")
    assert out[0] == [
        pytest.approx([1.5] * 3, rel=REL),
        pytest.approx([-0.5], rel=REL),
        pytest.approx([-0.5] * 2, rel=REL),
        pytest.approx([-0.5], rel=REL),
    ]


def test_rememr1_uneven_lengths_hand_computed():
    # t1, t2 read 2 chunks (steps 0, 1, final); t3 read 3 chunks (steps 0, 1, 2, final)
    outcome = [1.0, 0.0, 0.0]
    steps = [[1.0, 2.0, 1.0], [0.0, 1.0, 0.0], [0.5, 0.0, 0.7, 1.0]]
    keys = [[0, 1, "final"], [0, 1, "final"], [0, 1, 2, "final"]]
    # A_out: mean 1/3 -> [2/3, -1/3, -1/3]
    # step 0: [1, 0, 0.5], mean 0.5 -> [0.5, -0.5, 0]
    # step 1: [2, 1, 0], mean 1 -> [1, 0, -1]
    # step 2: only t3 -> A_state 0
    # final: [1, 0, 1], mean 2/3 -> [1/3, -2/3, 1/3]
    # A = 0.8 * A_out + 0.2 * A_state
    # t1: 0.5333333 + 0.2 * [0.5, 1, 1/3]     = [0.6333333, 0.7333333, 0.6]
    # t2: -0.2666667 + 0.2 * [-0.5, 0, -2/3]  = [-0.3666667, -0.2666667, -0.4]
    # t3: -0.2666667 + 0.2 * [0, -1, 0, 1/3]  = [-0.2666667, -0.4666667, -0.2666667, -0.2]
    out = rememr1_advantages(outcome, steps, ["g"] * 3, keys)
    assert out[0] == pytest.approx([0.6333333, 0.7333333, 0.6])
    assert out[1] == pytest.approx([-0.3666667, -0.2666667, -0.4])
    assert out[2] == pytest.approx([-0.2666667, -0.4666667, -0.2666667, -0.2])


def test_rememr1_missing_step_reward_is_left_out():
    # t2 has no reward at step 1: step 1 stats over t1 (3) and t3 (1): mean 2 -> [1, -, -1]
    # step 0: [0, 0, 0] -> all 0. A_out: [1, 0, 0] mean 1/3 -> [2/3, -1/3, -1/3]; alpha 0.5
    out = rememr1_advantages([1, 0, 0], [[0, 3], [0, None], [0, 1]], ["g"] * 3, alpha=0.5)
    # t1: [0.5 * 2/3, 0.5 * 2/3 + 0.5 * 1] = [0.3333333, 0.8333333]
    # t2: [-1/6, -1/6];  t3: [-1/6, -1/6 - 0.5] = [-0.1666667, -0.6666667]
    assert out == [
        pytest.approx([0.3333333, 0.8333333]),
        pytest.approx([-1 / 6, -1 / 6]),
        pytest.approx([-1 / 6, -0.6666667]),
    ]


def test_rememr1_std_on_and_single_member_group():
    # outcome [1, 0]: std sqrt(0.5) -> A_out = +-0.5 / 0.7071068 = +-0.7071068
    # step 0: [1, 1] -> 0;  step 1: [3, 1]: mean 2, std sqrt(2) -> +-1 / 1.4142136 = +-0.7071068
    # t1: [0.8 * 0.7071068, 0.8 * 0.7071068 + 0.2 * 0.7071068] = [0.5656854, 0.7071068]
    # group "solo" (one trajectory): A_out = r = 1.0, A_state = 0 -> [0.8, 0.8]
    out = rememr1_advantages([1, 0, 1], [[1, 3], [1, 1], [0.3, 0.5]], ["g", "g", "solo"], norm_by_std=True)
    assert out == [
        pytest.approx([0.5656854, 0.7071068], rel=REL),
        pytest.approx([-0.5656854, -0.7071068], rel=REL),
        pytest.approx([0.8, 0.8]),
    ]


def test_rememr1_argument_errors():
    with pytest.raises(ValueError, match="alpha must be in"):
        rememr1_advantages([1], [[1]], ["g"], alpha=1.5)
    with pytest.raises(ValueError, match="repeats a step key"):
        rememr1_advantages([1], [[1, 2]], ["g"], step_keys=[[0, 0]])
    with pytest.raises(ValueError, match="all must match"):
        rememr1_advantages([1, 0], [[1]], ["g", "g"])


def test_rememr1_estimator_reads_segments_and_aligns_final_steps():
    def t(tid, reward, step_rewards):
        segs = [seg(i, r) for i, r in enumerate(step_rewards[:-1])]
        segs.append(seg(len(step_rewards) - 1, step_rewards[-1], kind="final"))
        return Trajectory("q", tid, segs, reward=reward)

    # t1: memory steps 0, 1 then final (step 2); t2: memory step 0 then final (step 1)
    g = Group("q", [t("t1", 1.0, [1.0, 0.5, 1.0]), t("t2", 0.0, [0.0, 0.0])])
    # A_out = [0.5, -0.5]; step 0: [1, 0] -> [0.5, -0.5]; step 1: only t1 -> 0
    # "final": [1, 0] -> [0.5, -0.5] (t2's final is step 1 but lines up with t1's final, not its step 1)
    # t1: 0.4 + 0.2 * [0.5, 0, 0.5] = [0.5, 0.4, 0.5];  t2: -0.4 + 0.2 * [-0.5, -0.5] = [-0.5, -0.5]
    out = compute_group_advantages([g], "rememr1")
    assert out == [[pytest.approx([0.5, 0.4, 0.5]), pytest.approx([-0.5, -0.5])]]
    assert [s.advantage for s in g.trajectories[0].segments] == pytest.approx([0.5, 0.4, 0.5])


def test_rememr1_estimator_without_step_rewards_is_an_error():
    g = Group("q", [traj("q", "a", 1.0, 2), traj("q", "b", 0.0, 2)])
    with pytest.raises(ValueError, match="group q has no step rewards"):
        compute_group_advantages([g], "rememr1")


def test_registry():
    assert {"grpo", "dcpo", "rememr1"} <= set(advantage_names())
    with pytest.raises(KeyError, match="unknown advantage estimator 'nope'; known: .*grpo"):
        get_advantage("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda groups: [])

    @register_advantage("test-constant")
    def constant(groups, value=2.0):
        return [[[value] * len(tr.segments) for tr in g.trajectories] for g in groups]

    g = Group("q", [traj("q", "a", 1.0, 2)])
    compute_group_advantages([g], "test-constant", value=3.0)
    assert [s.advantage for s in g.trajectories[0].segments] == [3.0, 3.0]


def test_registered_options_are_the_estimators_and_losses_keyword_options():
    """An options dataclass names exactly its function's keyword parameters, with the same defaults."""
    import inspect

    from memrl.algorithms.registry import advantage_options, get_loss, loss_names, loss_options

    pairs = [(get_advantage(n), advantage_options(n)) for n in ("grpo", "dcpo", "rememr1")]
    pairs += [(get_loss(n), loss_options(n)) for n in loss_names()]
    for fn, opts in pairs:
        params = {p.name: p.default for p in list(inspect.signature(fn).parameters.values())
                  if p.default is not inspect.Parameter.empty}
        assert {f.name: f.default for f in dataclasses.fields(opts)} == params, fn.__name__


def test_trainer_fills_options_from_the_algorithm_section_without_a_name_switch():
    from memrl.algorithms.losses import PPOOptions
    from memrl.algorithms.options import DCPOOptions, GRPOOptions
    from memrl.config import load_config
    from memrl.training.assemble import algorithm_options
    from memrl.training.config import TrainConfig

    cfg = load_config(TrainConfig, ["model.path=x", "algorithm=dcpo", "algorithm.dcpo.eps=0.5",
                                             "algorithm.ppo.clip_high=0.28"])
    adv, loss = algorithm_options(cfg)
    assert adv == DCPOOptions(eps=0.5) and loss == PPOOptions(clip_low=0.2, clip_high=0.28, dual_clip_c=3.0)
    g = Group("q", [traj("q", "a", 1.0, 1), traj("q", "b", 0.0, 1)])
    # rewards [1, 0]: devs [0.5, -0.5], unbiased std 0.7071...; / (std + 0.5) -> +-0.5 / 1.2071 = +-0.41421
    compute_group_advantages([g], "dcpo", adv)
    assert [t.segments[0].advantage for t in g.trajectories] == pytest.approx([0.41421356, -0.41421356], rel=1e-6)
    cfg = load_config(TrainConfig, ["model.path=x", "algorithm.grpo.credit=split"])
    assert algorithm_options(cfg)[0] == GRPOOptions(norm_by_std=False, eps=1e-6, credit="split")

    @dataclasses.dataclass
    class NeedsGamma:
        gamma: float = 0.9

    register_advantage("test-gamma", NeedsGamma)(lambda groups, gamma=0.9: [])
    from memrl.config import ConfigError

    # its options are its own section, algorithm.<registered name>: defaults, or set there
    assert algorithm_options(load_config(TrainConfig, ["model.path=x", "algorithm.name=test-gamma"]))[0] == NeedsGamma()
    cfg = load_config(TrainConfig, ["model.path=x", "algorithm.name=test-gamma", "algorithm.test-gamma.gamma=0.5"])
    assert algorithm_options(cfg)[0] == NeedsGamma(gamma=0.5)
    with pytest.raises(ConfigError, match=r"algorithm\.test-gamma\.gama"):
        algorithm_options(load_config(TrainConfig, ["model.path=x", "algorithm.name=test-gamma",
                                                    "algorithm.test-gamma.gama=0.5"]))



# ReMemR1's released state term (ray_trainer.py fit(): the step reward tiled over 2 columns that
# compute_1D_grpo_advantage sums, so the step groups normalize 2 * r). One group, 2 trajectories x 3 steps.
# Outcome R = [1, 0] -> A_out = [0.5, -0.5] (no std). Step rewards t0 = [1, 0.25, 1], t1 = [0, 0.75, 1].
RELEASED_GROUP = ([1.0, 0.0], [[1.0, 0.25, 1.0], [0.0, 0.75, 1.0]])


def test_rememr1_released_state_term_doubles_the_paper_term_without_std():
    outcome, steps = RELEASED_GROUP
    # paper: step 0 mean 0.5 -> A_state [0.5, -0.5]; step 1 mean 0.5 -> [-0.25, 0.25]; step 2 equal -> 0
    #   t0: 0.8*0.5 + 0.2*[0.5, -0.25, 0] = [0.5, 0.35, 0.4];  t1: -0.4 + 0.2*[-0.5, 0.25, 0] = [-0.5, -0.35, -0.4]
    paper = rememr1_advantages(outcome, steps, ["g", "g"], state_term="paper")
    assert paper == [pytest.approx([0.5, 0.35, 0.4]), pytest.approx([-0.5, -0.35, -0.4])]
    # released: 2r - mean(2r) = [1, -1], [-0.5, 0.5], [0, 0] -> 0.8 * A_out + 0.4 * (r - mean r)
    #   t0: 0.4 + 0.2*[1, -0.5, 0] = [0.6, 0.3, 0.4];  t1: -0.4 + 0.2*[-1, 0.5, 0] = [-0.6, -0.3, -0.4]
    released = rememr1_advantages(outcome, steps, ["g", "g"], state_term="released")
    assert released == [pytest.approx([0.6, 0.3, 0.4]), pytest.approx([-0.6, -0.3, -0.4])]


def test_rememr1_released_state_term_with_std_halves_eps_only():
    outcome, steps = RELEASED_GROUP
    # eps = 0.1 makes the difference visible. A_out: [1, 0] -> +-0.5 / (sqrt(0.5) + 0.1) = +-0.5 / 0.8071068
    # = +-0.6194967. Step 0 paper: the same +-0.6194967; released: 2r = [2, 0] -> +-1 / (sqrt(2) + 0.1)
    # = +-0.6604088 (= 0.5 / (sqrt(0.5) + 0.05)). Step 1 ([0.25, 0.75]): paper -+0.25 / (sqrt(0.125) + 0.1)
    # = -+0.5512030; released -+0.5 / (sqrt(0.5) + 0.1) = -+0.6194967. Step 2 equal -> 0 in both.
    a = 0.8 * 0.6194967
    paper = rememr1_advantages(outcome, steps, ["g", "g"], norm_by_std=True, eps=0.1)
    assert paper[0] == pytest.approx([a + 0.2 * 0.6194967, a - 0.2 * 0.5512030, a], rel=1e-6)
    released = rememr1_advantages(outcome, steps, ["g", "g"], norm_by_std=True, eps=0.1, state_term="released")
    assert released[0] == pytest.approx([a + 0.2 * 0.6604088, a - 0.2 * 0.6194967, a], rel=1e-6)
    assert released[1] == pytest.approx([-a - 0.2 * 0.6604088, -a + 0.2 * 0.6194967, -a], rel=1e-6)


def test_rememr1_released_single_member_step_is_verls_group_of_one():
    # t0 has an extra step (key 3, r = 0.3) no other trajectory reached: paper A_state 0, released 2r = 0.6
    # (no std) or 0.6 / (1 + eps) (std; eps 0.1 -> 0.5454545). Outcome [1, 0]: A_out t0 = 0.5 / 0.6194967
    outcome, steps = [1.0, 0.0], [[1.0, 0.3], [0.0]]
    keys = [[0, 3], [0]]
    assert rememr1_advantages(outcome, steps, ["g", "g"], keys)[0][1] == pytest.approx(0.4)
    assert rememr1_advantages(outcome, steps, ["g", "g"], keys, state_term="released")[0][1] == pytest.approx(0.52)
    std = rememr1_advantages(outcome, steps, ["g", "g"], keys, norm_by_std=True, eps=0.1, state_term="released")
    assert std[0][1] == pytest.approx(0.8 * 0.6194967 + 0.2 * 0.5454545, rel=1e-6)


def test_rememr1_state_term_from_the_algorithm_section():
    from memrl.algorithms.options import ReMemR1Options
    from memrl.config import ConfigError, load_config
    from memrl.training.config import AlgorithmSection, TrainConfig

    opts = AlgorithmSection(name="rememr1", rememr1=ReMemR1Options(state_term="released")).options()[0]
    assert opts == ReMemR1Options(alpha=0.8, norm_by_std=False, eps=1e-6, state_term="released")
    outcome, steps = RELEASED_GROUP
    g = Group("q", [Trajectory("q", f"t{i}", [seg(j, r) for j, r in enumerate(s)], reward=outcome[i])
                    for i, s in enumerate(steps)])
    assert compute_group_advantages([g], "rememr1", opts) == [
        [pytest.approx([0.6, 0.3, 0.4]), pytest.approx([-0.6, -0.3, -0.4])]]
    with pytest.raises(ConfigError, match="algorithm.rememr1.state_term must be one of paper, released, got 'twice'"):
        load_config(TrainConfig, ["model.path=x", "algorithm.rememr1.state_term=twice"])
    with pytest.raises(ValueError, match="algorithm.rememr1.state_term must be one of paper, released, got 'twice'"):
        ReMemR1Options(state_term="twice")
    with pytest.raises(ValueError, match="state_term must be one of paper, released"):
        rememr1_advantages([1.0], [[1.0]], ["g"], state_term="x")
