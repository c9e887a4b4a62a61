"""FoldGRPO (arXiv 2510.11967 section 2.3): GRPO over the rows of folding trajectories, with token-level
process rewards.

    A_{i,t} = (clip(R_i + Q_{i,t}, 0, 1) - mean_j R_j) / (std_j R_j + eps)

over the G trajectories of a group (R: outcome rewards, std unbiased as memrl's grpo; a group whose
rewards all agree is not divided, so a penalty there stays -1, not -1/eps), Q_{i,t} the sum of the named
process rewards on token t of trajectory i's row. Every row of a trajectory (its main thread and each
branch: memrl.workflows.fold) gets its tokens' values, so a trajectory with b branches contributes b + 1
rows, each token weighing as the loss aggregation says (token-mean: every trained token of the batch
alike, so a long branch weighs by its length, as in the paper's 1 / sum |tau_i| objective). With no
process rewards (or all Q = 0) this is dcpo's GRPO (std division, credit=broadcast).

Process rewards (`fn(traj, seg, opts) -> one Q per response token`, registered by name; read from what the
fold workflow records: row info "kind", "turns", "turn_spans", "branch_turns", "error_turns"; trajectory
info "branches", "main_head_tokens", "context_budget", "stop", and "branch_scope" from the score stage,
memrl.rewards.fold):
- "unfolded": when the main thread's unfolded tokens (its final context minus the first prompt) pass
  unfolded_fraction x the context budget, Q = -unfolded_penalty on the main row's turns except those that
  opened a branch (`unfolded_spares=called`: that called branch at all) and the finishing (answer) turn
  (paper: -1 beyond 50%; published: branch and finish turns spared).
- "no_branch": a trajectory that opened no branch gets Q = -unfolded_penalty on all its main turns
  (published: `len(agent) == 1`; not in the default list, the paper does not name it).
- "scope": a branch with verdict v (+1 in scope, -1 out, 0 none) gets Q = v x scope_reward on its turns
  but the last (the return turn; published: range(len(chat) - 1)).
- "failure": Q = -failure_penalty on every turn answered with an error (`failure_rows=branch`: in branch
  rows only).
Terms add up on a token (`combine=replace`: a later term's non-zero value replaces an earlier one), and
`success_only` keeps them off trajectories whose outcome reward is not positive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memrl.algorithms.base import register_advantage
from memrl.algorithms.options import FoldGRPOOptions
from memrl.algorithms.process_rewards import process_rewards
from memrl.types import Group, Segment, Trajectory

__all__ = ["foldgrpo_estimator", "foldgrpo_token_advantages"]

def foldgrpo_token_advantages(reward: float, q: Sequence[float], mean: float, std: float | None, clip: bool,
                              eps: float) -> list[float]:
    """(clip(R + Q_t, 0, 1) - mean) / (std + eps) per token; std None = no division."""
    out = []
    for v in q:
        x = reward + v
        if clip:
            x = min(1.0, max(0.0, x))
        x -= mean
        out.append(x / (std + eps) if std is not None else x)
    return out


@register_advantage("foldgrpo", FoldGRPOOptions)
def foldgrpo_estimator(
    groups: Sequence[Group], process_rewards: Sequence[str],
    unfolded_fraction: float = FoldGRPOOptions.unfolded_fraction,
    unfolded_penalty: float = FoldGRPOOptions.unfolded_penalty, scope_reward: float = FoldGRPOOptions.scope_reward,
    failure_penalty: float = FoldGRPOOptions.failure_penalty, eps: float = FoldGRPOOptions.eps,
    clip: bool = FoldGRPOOptions.clip, success_only: bool = FoldGRPOOptions.success_only,
    combine: str = FoldGRPOOptions.combine, failure_rows: str = FoldGRPOOptions.failure_rows,
    unfolded_spares: str = FoldGRPOOptions.unfolded_spares,
) -> list[list[list[list[float]]]]:
    """FoldGRPO (module docstring): one value per response token of every row. A trajectory marked
    `info["exclude_from_group"]` (overlong masking, a failed judgement) is left out of the statistics and
    gets 0 on every token. `process_rewards`: the names of the
    terms (no default here: algorithm.foldgrpo.process_rewards is the one place it is set)."""
    opts = FoldGRPOOptions(list(process_rewards), unfolded_fraction, unfolded_penalty, scope_reward,
                           failure_penalty, eps, clip, success_only, combine, failure_rows, unfolded_spares)
    out: list[list[list[list[float]]]] = []
    for group in groups:
        rewards = group.rewards
        kept = [r for r, t in zip(rewards, group.trajectories, strict=True) if not t.info.get("exclude_from_group")]
        mean = sum(kept) / len(kept) if kept else 0.0
        std: float | None = None
        if len(kept) >= 2:
            s = math.sqrt(sum((r - mean) ** 2 for r in kept) / (len(kept) - 1))
            std = s if s > 0 else None  # rewards all agree: no division (memrl's guard; module docstring)
        if len(kept) == 1:
            mean = 0.0  # a group of one: A = clip(R + Q) (memrl's grpo: A = r)
        per_group = []
        for traj, r in zip(group.trajectories, rewards, strict=True):
            if traj.info.get("exclude_from_group"):
                per_group.append([[0.0] * len(s.response_ids) for s in traj.segments])
                continue
            per_group.append([foldgrpo_token_advantages(r, process_rewards_of(traj, s, opts), mean, std, clip, eps)
                              for s in traj.segments])
        out.append(per_group)
    return out


def process_rewards_of(traj: Trajectory, seg: Segment, opts: FoldGRPOOptions) -> list[float]:
    """The summed process rewards of `seg` under `opts`."""
    return process_rewards(traj, seg, opts.process_rewards, opts)
