"""FoldGRPO's token-level process rewards (arXiv 2510.11967 section 2.3.2), registered by name: each
`fn(traj, seg, opts) -> one Q per response token of seg`; the foldgrpo estimator (memrl.algorithms.fold)
sums the ones it is given. The terms are described there."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memrl.types import Segment, Trajectory

ProcessReward = Callable[[Trajectory, Segment, Any], list[float]]
PROCESS_REWARDS: dict[str, ProcessReward] = {}


def register_process_reward(name: str) -> Callable[[ProcessReward], ProcessReward]:
    """Make `name` a token-level process reward `algorithm.foldgrpo.process_rewards` may list."""
    def deco(fn: ProcessReward) -> ProcessReward:
        PROCESS_REWARDS[name] = fn
        return fn
    return deco


def _on_turns(seg: Segment, turns: set[int], value: float) -> list[float]:
    """`value` on the sampled ids of `turns` in `seg` (its info["turn_spans"]), 0 elsewhere."""
    out = [0.0] * len(seg.response_ids)
    for turn, start, end in seg.info.get("turn_spans", ()):
        if turn in turns:
            for i in range(start, min(end, len(out))):
                out[i] = value
    return out


def unfolded_tokens(traj: Trajectory) -> int:
    """The main thread's final context minus its first prompt (published: `len(main.context()) - init_len`)."""
    return int(traj.metrics.get("final_context_tokens", 0)) - int(traj.info.get("main_head_tokens", 0))


@register_process_reward("unfolded")
def unfolded_penalty(traj: Trajectory, seg: Segment, opts: Any) -> list[float]:
    if seg.info.get("kind") != "main":
        return [0.0] * len(seg.response_ids)
    if unfolded_tokens(traj) <= opts.unfolded_fraction * float(traj.info.get("context_budget", 0)):
        return [0.0] * len(seg.response_ids)
    key = "branch_call_turns" if opts.unfolded_spares == "called" else "branch_turns"
    spared = set(seg.info.get(key, ()))
    if traj.info.get("stop") == "answer" and seg.info.get("turns"):
        spared.add(seg.info["turns"][-1])  # the finishing turn
    return _on_turns(seg, set(seg.info.get("turns", ())) - spared, -opts.unfolded_penalty)


@register_process_reward("no_branch")
def no_branch_penalty(traj: Trajectory, seg: Segment, opts: Any) -> list[float]:
    if seg.info.get("kind") != "main" or traj.info.get("branches"):
        return [0.0] * len(seg.response_ids)
    return _on_turns(seg, set(seg.info.get("turns", ())), -opts.unfolded_penalty)


@register_process_reward("scope")
def scope_reward(traj: Trajectory, seg: Segment, opts: Any) -> list[float]:
    if seg.info.get("kind") != "branch":
        return [0.0] * len(seg.response_ids)
    verdicts = traj.info.get("branch_scope") or []
    k = int(seg.info.get("thread", -1))
    verdict = verdicts[k] if 0 <= k < len(verdicts) else 0
    return _on_turns(seg, set(list(seg.info.get("turns", ()))[:-1]), opts.scope_reward * float(verdict))


@register_process_reward("failure")
def failure_penalty(traj: Trajectory, seg: Segment, opts: Any) -> list[float]:
    if opts.failure_rows == "branch" and seg.info.get("kind") != "branch":
        return [0.0] * len(seg.response_ids)
    return _on_turns(seg, set(seg.info.get("error_turns", ())), -opts.failure_penalty)


FOLD_PROCESS_REWARDS = ("unfolded", "no_branch", "scope", "failure")
"""The built-in terms: each reads what the fold workflow records (WorkflowSpec.branches), and is 0 on the rows
of any other workflow."""


def process_rewards(traj: Trajectory, seg: Segment, names: Sequence[str], opts: Any) -> list[float]:
    """The named terms on each response token of `seg`, met as `opts.combine` says (summed, or a later
    term's non-zero value replacing an earlier one); all 0 on a trajectory without a positive outcome
    reward when `opts.success_only`."""
    total = [0.0] * len(seg.response_ids)
    for name in names:
        if name not in PROCESS_REWARDS:
            raise KeyError(f"unknown process reward {name!r}; known: {', '.join(sorted(PROCESS_REWARDS))}")
    if opts.success_only and not float(traj.reward or 0.0) > 0:
        return total
    for name in names:
        for i, q in enumerate(PROCESS_REWARDS[name](traj, seg, opts)):
            if opts.combine == "replace":
                total[i] = q if q != 0 else total[i]
            else:
                total[i] += q
    return total
