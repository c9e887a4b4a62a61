"""Advantage estimators over groups of trajectories (GRPO, with QwenLong-L1.5's task std; ReMemR1 arXiv
2509.23040; MemAct DCPO arXiv 2510.12635; RLOO arXiv 2402.14740; REINFORCE++ and its baseline variant arXiv
2501.03262, as verl's core_algos computes them).

Group statistics are taken over TRAJECTORIES (one outcome reward each), never over rows, so a
trajectory with many segments does not count more. The list functions (`grpo_advantages`,
`rememr1_advantages`) are the math; the registered estimators apply them to `Group`s and return one
value per segment, indexed `[group][trajectory][segment]`; `compute_group_advantages` writes those
values onto `Segment.advantage`. Each `Group` object is its own group (its position in the list keys
it), so two groups for the same task are never pooled.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any, Literal

from memrl.algorithms.base import ADVANTAGE, ADVANTAGES, lookup, options_kwargs, register_advantage
from memrl.algorithms.options import (
    STATE_TERMS,
    DCPOOptions,
    GRPOOptions,
    ReinforcePPOptions,
    ReMemR1Options,
    RLOOOptions,
)
from memrl.types import Group, Segment, Trajectory

__all__ = ["assign_advantages", "compute_group_advantages", "dcpo_estimator", "grpo_advantages", "grpo_estimator",
           "grpo_task_advantages", "reinforce_pp_baseline_estimator", "reinforce_pp_estimator", "rememr1_advantages",
           "rememr1_estimator", "rloo_advantages", "rloo_estimator", "task_kind", "token_whiten"]

Credit = Literal["broadcast", "split"]
SegmentAdvantages = list[list[list[Any]]]
"""`[group][trajectory][segment]` -> a float, or a list of floats (one per response token: token-level terms)."""


def _centre(values: list[float], norm_by_std: bool, eps: float) -> list[float]:
    """values - mean, divided by (unbiased std + eps) when norm_by_std; needs len(values) >= 2."""
    mean = sum(values) / len(values)
    out = [v - mean for v in values]
    if norm_by_std:
        std = math.sqrt(sum(d * d for d in out) / (len(values) - 1))
        out = [d / (std + eps) for d in out]
    return out


def grpo_advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], norm_by_std: bool, eps: float = GRPOOptions.eps
) -> list[float]:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps), std unbiased; r_i - mean_g without std division.

    One value per trajectory; statistics over the trajectories sharing a group id. A group of one
    gets A = r exactly (mean 0, std 1, as verl treats it).
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"grpo_advantages: {len(rewards)} rewards but {len(group_ids)} group ids")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        if len(idx) == 1:
            out[idx[0]] = float(rewards[idx[0]])
            continue
        for i, a in zip(idx, _centre([float(rewards[i]) for i in idx], norm_by_std, eps), strict=True):
            out[i] = a
    return out


def _members(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    return members


def grpo_task_advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], task_keys: Sequence[Hashable],
    eps: float = GRPOOptions.eps,
) -> list[float]:
    """QwenLong-L1.5's task-specific advantage: A_i = (r_i - mean_g) / (std_task + eps), the mean over the
    trajectories of i's group (a group of one: 0), the unbiased std over every trajectory of the batch whose
    task kind (`task_keys`) is i's (a kind of one: 0)."""
    n = len(rewards)
    if len(group_ids) != n or len(task_keys) != n:
        raise ValueError(f"grpo_task_advantages: {n} rewards, {len(group_ids)} group ids, {len(task_keys)} task keys")
    mean = {g: (0.0 if len(idx) == 1 else sum(float(rewards[i]) for i in idx) / len(idx))
            for g, idx in _members(group_ids).items()}
    std = {}
    for k, idx in _members(task_keys).items():
        vals = [float(rewards[i]) for i in idx]
        m = sum(vals) / len(vals)
        std[k] = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return [(float(r) - mean[g]) / (std[k] + eps) for r, g, k in zip(rewards, group_ids, task_keys, strict=True)]


def rloo_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable]) -> list[float]:
    """RLOO: A_i = r_i - mean of the OTHER trajectories of i's group = n/(n-1) * (r_i - mean_g) (verl's
    compute_rloo_outcome_advantage); a group of one gets A = r."""
    if len(rewards) != len(group_ids):
        raise ValueError(f"rloo_advantages: {len(rewards)} rewards but {len(group_ids)} group ids")
    out = [float(r) for r in rewards]
    for idx in _members(group_ids).values():
        k = len(idx)
        if k > 1:
            mean = sum(float(rewards[i]) for i in idx) / k
            for i in idx:
                out[i] = k / (k - 1) * (float(rewards[i]) - mean)
    return out


def token_whiten(values: Sequence[float], tokens: Sequence[int], eps: float = ReinforcePPOptions.whiten_eps) -> list[float]:
    """verl's masked_whiten where value i stands on `tokens[i]` trained tokens: (v - mu) / sqrt(var + eps), mu
    and the unbiased var over the N = sum(tokens) tokens (so a longer row weighs more in the statistics)."""
    n = sum(tokens)
    if n < 2:
        raise ValueError(f"token whitening needs at least 2 trained tokens in the batch, got {n}")
    mu = sum(v * t for v, t in zip(values, tokens, strict=True)) / n
    var = sum(t * (v - mu) ** 2 for v, t in zip(values, tokens, strict=True)) / (n - 1)
    return [(v - mu) / math.sqrt(var + eps) for v in values]


def assign_advantages(
    trajectories: Sequence[Trajectory], advantages: Sequence[float], credit: str = GRPOOptions.credit
) -> None:
    """Write each trajectory's advantage A onto its segments: `broadcast` gives every segment A, `split` A/T."""
    if len(trajectories) != len(advantages):
        raise ValueError(
            f"assign_advantages: {len(trajectories)} trajectories but {len(advantages)} advantages"
        )
    for traj, a in zip(trajectories, advantages, strict=True):
        for seg, v in zip(traj.segments, _credit(a, len(traj.segments), credit), strict=True):
            seg.advantage = v


def _credit(a: float, num_segments: int, credit: str) -> list[float]:
    if credit == "broadcast":
        return [a] * num_segments
    if credit == "split":
        return [a / num_segments] * num_segments
    raise ValueError(f"unknown credit mode {credit!r}; expected 'broadcast' or 'split'")


def rememr1_advantages(
    outcome_rewards: Sequence[float],
    step_rewards: Sequence[Sequence[float | None]],
    group_ids: Sequence[Hashable],
    step_keys: Sequence[Sequence[Hashable]] | None = None,
    alpha: float = ReMemR1Options.alpha,
    norm_by_std: bool = ReMemR1Options.norm_by_std,
    eps: float = ReMemR1Options.eps,
    state_term: str = ReMemR1Options.state_term,
) -> list[list[float]]:
    """ReMemR1 multi-level advantage: A_{i,t} = alpha * A_out,i + (1 - alpha) * A_state,i,t.

    `state_term="released"` computes A_state as the released trainer does (ReMemR1 ray_trainer.py
    fit(): the step reward is tiled over 2 columns that compute_1D_grpo_advantage sums, so it normalizes
    2 * r): A_state = 2r - mean(2r), i.e. 2 * (r - mean r), without std division (the released scripts'
    grpo_use_adv=False), or (2r - mean(2r)) / (std(2r) + eps) = (r - mean r) / (std(r) + eps / 2) with it;
    a step key held by one trajectory gets 2r (resp. 2r / (1 + eps)), verl's group-of-one rule. At
    alpha 0.8 without std: 0.8 * A_out + 0.4 * (r - mean r).

    A_out is GRPO over the group's outcome rewards. A_state,i,t normalizes r_{i,t} over the
    trajectories of the same group that HAVE a step with key t and a step reward there (mean-centred,
    std division optional). Uneven lengths: a step key held by only one trajectory gets A_state = 0
    (nothing to compare with), and a segment whose step reward is None gets A_state = 0 and is left out
    of the statistics. `step_keys` default to the segment positions 0..T-1.
    Returns one value per segment, per trajectory.
    """
    n = len(outcome_rewards)
    if len(step_rewards) != n or len(group_ids) != n:
        raise ValueError(
            f"rememr1_advantages: {n} outcome rewards, {len(step_rewards)} step-reward lists and "
            f"{len(group_ids)} group ids; all must match"
        )
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"rememr1_advantages: alpha must be in [0, 1], got {alpha}")
    if state_term not in STATE_TERMS:
        raise ValueError(f"rememr1_advantages: state_term must be one of {', '.join(STATE_TERMS)}, got {state_term!r}")
    scale = 2.0 if state_term == "released" else 1.0
    keys = [list(range(len(s))) for s in step_rewards] if step_keys is None else [list(k) for k in step_keys]
    for i, (k, s) in enumerate(zip(keys, step_rewards, strict=True)):
        if len(k) != len(s):
            raise ValueError(
                f"rememr1_advantages: trajectory {i} has {len(s)} step rewards but {len(k)} step keys"
            )
        if len(set(k)) != len(k):
            raise ValueError(f"rememr1_advantages: trajectory {i} repeats a step key: {k}")

    a_out = grpo_advantages(outcome_rewards, group_ids, norm_by_std, eps)
    a_state = [[0.0] * len(s) for s in step_rewards]
    cells: dict[tuple[Hashable, Hashable], list[tuple[int, int]]] = defaultdict(list)
    for i, (g, k, s) in enumerate(zip(group_ids, keys, step_rewards, strict=True)):
        for j, (key, r) in enumerate(zip(k, s, strict=True)):
            if r is not None:
                cells[(g, key)].append((i, j))
    for where in cells.values():
        values = [scale * float(step_rewards[i][j]) for i, j in where]  # type: ignore[arg-type]
        if len(where) < 2:
            if state_term == "released":  # verl's group of one: mean 0, std 1
                (i, j), = where
                a_state[i][j] = values[0] / (1.0 + eps) if norm_by_std else values[0]
            continue  # paper: a step only one trajectory reached has nothing to compare with, A_state = 0
        centred = _centre(values, norm_by_std, eps)
        for (i, j), a in zip(where, centred, strict=True):
            a_state[i][j] = a
    return [[alpha * a_out[i] + (1.0 - alpha) * a for a in a_state[i]] for i in range(n)]


def _outcomes(groups: Sequence[Group]) -> tuple[list[float], list[int], list[Trajectory]]:
    rewards, gids, trajs = [], [], []
    for gi, group in enumerate(groups):
        for traj, r in zip(group.trajectories, group.rewards, strict=True):
            rewards.append(r)
            gids.append(gi)
            trajs.append(traj)
    return rewards, gids, trajs


def _regroup(groups: Sequence[Group], per_traj: list[list[float]]) -> SegmentAdvantages:
    out: SegmentAdvantages = []
    it = iter(per_traj)
    for group in groups:
        out.append([next(it) for _ in group.trajectories])
    return out


@register_advantage("grpo", GRPOOptions)
def grpo_estimator(
    groups: Sequence[Group], norm_by_std: bool = GRPOOptions.norm_by_std, eps: float = GRPOOptions.eps,
    credit: str = GRPOOptions.credit, std_over: str = GRPOOptions.std_over, task_key: str = GRPOOptions.task_key,
) -> SegmentAdvantages:
    """GRPO over trajectories (`grpo_advantages`; with norm_by_std and std_over=task, `grpo_task_advantages`
    over the tasks' `meta[task_key]`), credited to segments by `broadcast` or `split`.

    A trajectory marked `info["exclude_from_group"]` (MemAct's failed LLM judgement under
    workflow.judge.on_failure=exclude) is left out of its group's mean and std and gets advantage 0."""
    rewards, gids, trajs = _outcomes(groups)
    kept = _kept(trajs)
    if norm_by_std and std_over == "task":
        kinds = [task_kind(g, task_key) for g in groups for _ in g.trajectories]
        values = grpo_task_advantages([rewards[i] for i in kept], [gids[i] for i in kept], [kinds[i] for i in kept],
                                      eps)
    else:
        values = grpo_advantages([rewards[i] for i in kept], [gids[i] for i in kept], norm_by_std, eps)
    return _regroup(groups, [_credit(a, len(t.segments), credit) for a, t in zip(_spread(kept, values, len(trajs)),
                                                                                   trajs, strict=True)])


def _kept(trajs: Sequence[Trajectory]) -> list[int]:
    """Trajectories that take part in their group's statistics (not `info["exclude_from_group"]`)."""
    return [i for i, t in enumerate(trajs) if not t.info.get("exclude_from_group")]


def _spread(kept: list[int], values: Sequence[float], n: int) -> list[float]:
    """`values` at positions `kept` of n, 0 elsewhere (the excluded trajectories)."""
    out = [0.0] * n
    for i, a in zip(kept, values, strict=True):
        out[i] = a
    return out


def task_kind(group: Group, key: str) -> Hashable:
    """The task kind of a group: its Task's `meta[key]` (GRPOOptions.task_key); an error naming the task without."""
    if group.task is None or key not in group.task.meta:
        raise ValueError(f"task {group.task_id} has no meta[{key!r}] (algorithm.grpo.task_key), which "
                         "algorithm.grpo.std_over=task and data.sampling=task_balanced read")
    return str(group.task.meta[key])


@register_advantage("rloo", RLOOOptions)
def rloo_estimator(groups: Sequence[Group], credit: str = RLOOOptions.credit) -> SegmentAdvantages:
    """RLOO over trajectories (`rloo_advantages`), credited to segments by `broadcast` or `split`; a trajectory
    marked `info["exclude_from_group"]` is left out of its group and gets 0, as under grpo."""
    rewards, gids, trajs = _outcomes(groups)
    kept = _kept(trajs)
    values = rloo_advantages([rewards[i] for i in kept], [gids[i] for i in kept])
    return _regroup(groups, [_credit(a, len(t.segments), credit) for a, t in zip(_spread(kept, values, len(trajs)),
                                                                                   trajs, strict=True)])


def _whitened(groups: Sequence[Group], values: Sequence[float], kept: list[int], trajs: list[Trajectory],
              eps: float) -> SegmentAdvantages:
    tokens = [sum(s.num_trained_tokens for s in trajs[i].segments) for i in kept]
    white = token_whiten(values, tokens, eps)
    return _regroup(groups, [[a] * len(t.segments) for a, t in zip(_spread(kept, white, len(trajs)), trajs, strict=True)])


@register_advantage("reinforce_pp", ReinforcePPOptions)
def reinforce_pp_estimator(groups: Sequence[Group], whiten_eps: float = ReinforcePPOptions.whiten_eps) -> SegmentAdvantages:
    """REINFORCE++ (verl's compute_reinforce_plus_plus_outcome_advantage) at gamma = 1 with the KL in the loss:
    every trained token's return is its trajectory's outcome r, whitened over all trained tokens of the batch,
    A = (r - mu_tok) / sqrt(var_tok + eps); every segment of the trajectory gets it. No group baseline."""
    rewards, _, trajs = _outcomes(groups)
    kept = _kept(trajs)
    return _whitened(groups, [rewards[i] for i in kept], kept, trajs, whiten_eps)


@register_advantage("reinforce_pp_baseline", ReinforcePPOptions)
def reinforce_pp_baseline_estimator(groups: Sequence[Group], whiten_eps: float = ReinforcePPOptions.whiten_eps) -> SegmentAdvantages:
    """REINFORCE++-baseline (verl's compute_reinforce_plus_plus_baseline_outcome_advantage): r - mean of the
    group's trajectories (a group of one: mean 0), then whitened over all trained tokens of the batch as
    `reinforce_pp_estimator`."""
    rewards, gids, trajs = _outcomes(groups)
    kept = _kept(trajs)
    members = _members([gids[i] for i in kept])
    centred = [rewards[i] for i in kept]
    for idx in members.values():
        if len(idx) > 1:
            mean = sum(centred[j] for j in idx) / len(idx)
            for j in idx:
                centred[j] = rewards[kept[j]] - mean
    return _whitened(groups, centred, kept, trajs, whiten_eps)


@register_advantage("dcpo", DCPOOptions)
def dcpo_estimator(groups: Sequence[Group], eps: float = DCPOOptions.eps) -> SegmentAdvantages:
    """MemAct DCPO: A = (R - mean) / (std + eps) over distinct trajectories, given to every segment."""
    return grpo_estimator(groups, norm_by_std=True, eps=eps, credit="broadcast")


def _step_key(seg_step: int, kind: object) -> Hashable:
    # The final answer step lines up with the other trajectories' final steps even when they read a
    # different number of chunks; memory steps line up by their step index.
    return "final" if kind == "final" else seg_step


StepRewards = Sequence[Sequence[Sequence[float | None] | None]]
"""Step rewards as the score stage returns them: `[group][trajectory]` -> one value (or None) per segment,
or None for a trajectory without step rewards (memrl.types.Score.step_rewards)."""


@register_advantage("rememr1", ReMemR1Options)
def rememr1_estimator(
    groups: Sequence[Group], alpha: float = ReMemR1Options.alpha, norm_by_std: bool = ReMemR1Options.norm_by_std,
    eps: float = ReMemR1Options.eps, state_term: str = ReMemR1Options.state_term, *, step_rewards: StepRewards | None,
) -> SegmentAdvantages:
    """ReMemR1 (`rememr1_advantages`) from trajectory rewards and the step rewards the score stage returned
    (`step_rewards`, `[group][trajectory][segment]`, keyword-only, an input rather than an option; None:
    `Segment.step_reward` as written on hand-built segments); steps keyed by `Segment.step`.

    A segment with `info["kind"] == "final"` is keyed "final", so final answers compare with final answers.
    """
    if step_rewards is None:
        step_rewards = [[[s.step_reward for s in t.segments] for t in g.trajectories] for g in groups]
    if len(step_rewards) != len(groups):
        raise ValueError(f"rememr1 advantage: {len(step_rewards)} groups of step rewards for {len(groups)} groups")
    for group, per_group in zip(groups, step_rewards, strict=True):
        if all(v is None for per_traj in per_group for v in (per_traj or [])):
            raise ValueError(
                f"rememr1 advantage: group {group.task_id} has no step rewards; its workflow must give them "
                "(WorkflowSpec.step_rewards: memagent and rememr1 do) or set Segment.step_reward"
            )
    rewards, gids, trajs = _outcomes(groups)
    flat = [per_traj for per_group in step_rewards for per_traj in per_group]
    per_traj_steps = [list(r) if r is not None else [None] * len(t.segments) for r, t in zip(flat, trajs, strict=True)]
    keys = [[_step_key(s.step, s.info.get("kind")) for s in t.segments] for t in trajs]
    per_traj = rememr1_advantages(rewards, per_traj_steps, gids, keys, alpha, norm_by_std, eps, state_term)
    return _regroup(groups, per_traj)


def compute_group_advantages(
    groups: Sequence[Group], name: str = "grpo", options: Any = None, step_rewards: StepRewards | None = None,
    **kwargs: object
) -> SegmentAdvantages:
    """Run the estimator registered as `name` with `options` (its options dataclass, e.g. from
    AlgorithmSection.options()) or keyword options, and write its values onto every `Segment.advantage`.
    `step_rewards` (the score stage's, `[group][trajectory][segment]`) go to an estimator that takes them."""
    fn = lookup(ADVANTAGES, ADVANTAGE, name)
    if "step_rewards" in inspect.signature(fn).parameters:  # a keyword-only input, not an option
        kwargs["step_rewards"] = step_rewards
    values = fn(groups, **options_kwargs(options), **kwargs)
    if len(values) != len(groups):
        raise ValueError(f"advantage estimator {name!r} returned {len(values)} groups for {len(groups)}")
    for group, per_group in zip(groups, values, strict=True):
        if len(per_group) != len(group.trajectories):
            raise ValueError(
                f"advantage estimator {name!r}: wrong trajectory count for group {group.task_id}"
            )
        for traj, per_traj in zip(group.trajectories, per_group, strict=True):
            if len(per_traj) != len(traj.segments):
                raise ValueError(
                    f"advantage estimator {name!r}: {len(per_traj)} values for the "
                    f"{len(traj.segments)} segments of trajectory {traj.trajectory_id}"
                )
            for seg, a in zip(traj.segments, per_traj, strict=True):
                write_advantage(seg, a, name)
    return values


def write_advantage(seg: Segment, value: float | Sequence[float], name: str = "?") -> None:
    """Write an estimator's value onto `seg`: a number (every token), or one number per response token
    (token-level terms: `token_advantages`, with `advantage` their mean over the trained tokens)."""
    if isinstance(value, int | float):
        seg.advantage, seg.token_advantages = float(value), None
        return
    values = [float(v) for v in value]
    if len(values) != len(seg.response_ids):
        raise ValueError(f"advantage estimator {name!r}: {len(values)} token values for a row of "
                         f"{len(seg.response_ids)} response tokens (trajectory {seg.trajectory_id})")
    trained = [v for v, m in zip(values, seg.loss_mask or [], strict=True) if m]
    seg.token_advantages = values
    seg.advantage = sum(trained) / len(trained) if trained else 0.0
