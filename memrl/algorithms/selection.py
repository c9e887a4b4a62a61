"""Which groups and segments train: DAPO dynamic sampling and MemAct's DCPO segment selection
(`algorithm.selection`: "published", the public sampler, or memrl's "spread_unused"; docs/concepts/memact.md
says how each weighs trajectories)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence

from memrl.types import Group, Segment


def filter_zero_variance_groups(groups: Sequence[Group], tol: float = 1e-12) -> tuple[list[Group], int]:
    """DAPO dynamic sampling: drop groups whose trajectory rewards all agree (max - min <= tol).

    Decided per `Group` from its trajectories' outcome rewards (one per trajectory, however many
    segments each has), never from row positions. A group of one trajectory is kept, as in DAPO/verl
    (its GRPO advantage is r, not 0). Returns (kept groups in order, number dropped).
    """
    kept: list[Group] = []
    for group in groups:
        rewards = group.rewards
        if len(rewards) == 1 or (rewards and max(rewards) - min(rewards) > tol):
            kept.append(group)
    return kept, len(groups) - len(kept)


def aepo_gate(entropy: float, low: float | None, high: float | None) -> bool:
    """AEPO's gate (QwenLong-L1.5): on while low < entropy < high (a None bound is no bound)."""
    return (low is None or entropy > low) and (high is None or entropy < high)


def aepo_rows(per_group: Sequence[Sequence[Segment]], rewards: dict[str, float]) -> list[list[Segment]]:
    """AEPO with its gate on: of each group's rows, those with advantage > 0 whose trajectory's reward
    (`rewards[trajectory_id]`) is > 0, as the published trainer keeps them (the rows a negative-advantage
    gradient would train are dropped before the update, and so leave its normalizers too)."""
    return [[s for s in segs if float(s.advantage or 0.0) > 0 and rewards[s.trajectory_id] > 0] for segs in per_group]


def truncate_to_multiple(per_group: Sequence[Sequence[Segment]], multiple: int) -> list[list[Segment]]:
    """The first floor(k / multiple) * multiple of the k rows of `per_group`, in batch order (groups in
    order, each group's rows in order), the rest dropped: the published AEPO trainer's truncation of its kept
    rows to a multiple of the actor's world size (`algorithm.aepo.keep_multiple_of`). multiple 0 or 1 keeps
    every row."""
    if multiple <= 1:
        return [list(segs) for segs in per_group]
    left = sum(len(segs) for segs in per_group) // multiple * multiple
    out = []
    for segs in per_group:
        out.append(list(segs[:left]))
        left -= len(out[-1])
    return out


def batch_entropy(row_entropy_sums: Sequence[float], row_weights: Sequence[float]) -> float:
    """The batch's entropy as the loss aggregates it: sum over rows of weight * (sum of the row's trained
    tokens' entropies), the weights memrl.algorithms.losses.row_weights gives for algorithm.loss_agg
    (token-mean: the mean entropy per trained token, as verl's agg_loss)."""
    return sum(w * e for w, e in zip(row_weights, row_entropy_sums, strict=True))


def spread_unused_segments(group: Group, n: int, rng: random.Random) -> list[Segment]:
    """memrl's DCPO selection (`algorithm.selection=spread_unused`): n segments, never one twice.

    Trajectories are visited in one rng-shuffled order (so with more trajectories than n, a random n
    get one segment each), then again and again: each visit takes a uniformly random segment of that
    trajectory not taken yet, and trajectories with none left are skipped. So the rows beyond one per
    trajectory go to the trajectories that still have unused segments, i.e. those that pruned (K = 8,
    n = 12: one 10-segment trajectory among seven single-segment ones trains 5 rows). When every
    segment is taken before n is reached, fewer than n come back. Deterministic given the rng state.
    """
    if n < 0:
        raise ValueError(f"spread_unused_segments: n must be >= 0, got {n}")
    trajs = [t for t in group.trajectories if t.segments]
    if not trajs or n == 0:
        return []
    order = list(range(len(trajs)))
    rng.shuffle(order)
    unused = {i: list(range(len(trajs[i].segments))) for i in order}
    chosen: list[Segment] = []
    while len(chosen) < n and any(unused.values()):
        for i in order:
            if len(chosen) == n:
                break
            pool = unused[i]
            if pool:
                chosen.append(trajs[i].segments[pool.pop(rng.randrange(len(pool)))])
    return chosen


def published_segments(group: Group, n: int, rng: random.Random) -> list[Segment]:
    """The public MemAct sampler (`algorithm.selection=published`; upstream
    verl/experimental/agent_loop/agent_loop.py, AgentLoopManager._sampling_random): exactly n rows.

    K = trajectories with a segment. K >= n: n of them drawn without replacement, one uniformly random
    segment each. K < n: one uniformly random segment of every trajectory (in group order), then the
    n - K remaining slots cycle over one rng-shuffled list of all K trajectories (a single pass when
    n - K <= K), each visit taking a random segment of that trajectory not taken yet, or, when it has
    none left, a random one of all its segments again (a repeated row). So with K = 8, n = 12 every
    trajectory trains 1 or 2 rows (1 + Bernoulli(1/2)), whatever its segment count. The public code draws
    from Python's process-wide `random`; here `rng` (seeded by the trainer) makes it reproducible.
    """
    if n < 0:
        raise ValueError(f"published_segments: n must be >= 0, got {n}")
    trajs = [t for t in group.trajectories if t.segments]
    if not trajs or n == 0:
        return []
    if len(trajs) >= n:
        return [t.segments[rng.randrange(len(t.segments))] for t in rng.sample(trajs, n)]
    used: list[set[int]] = []
    chosen: list[Segment] = []
    for t in trajs:
        j = rng.randrange(len(t.segments))
        used.append({j})
        chosen.append(t.segments[j])
    cycle = list(range(len(trajs)))
    rng.shuffle(cycle)
    for k in range(n - len(trajs)):
        i = cycle[k % len(cycle)]
        free = [j for j in range(len(trajs[i].segments)) if j not in used[i]]
        j = free[rng.randrange(len(free))] if free else rng.randrange(len(trajs[i].segments))
        used[i].add(j)
        chosen.append(trajs[i].segments[j])
    return chosen


SELECTIONS: dict[str, Callable[[Group, int, random.Random], list[Segment]]] = {
    "published": published_segments,
    "spread_unused": spread_unused_segments,
}
"""`algorithm.selection` -> rule; "all" (every segment trains) is not a rule but the absence of one."""


def select_segments(
    groups: Sequence[Group], rule: str, n: int, rng: random.Random
) -> list[list[Segment]]:
    """Per group (in order, one rng for the whole batch), the segments that train under `rule`."""
    if rule not in SELECTIONS:
        raise ValueError(f"unknown segment selection {rule!r}; known: {', '.join(sorted(SELECTIONS))}")
    return [SELECTIONS[rule](g, n, rng) for g in groups]


def selection_rng(seed: int, step: int) -> random.Random:
    """The rng of step `step`'s segment selection: from the seed and step alone, so resume is exact
    (the string is the one memrl used before selection had its own key, so old runs select alike)."""
    return random.Random(f"dcpo:{seed}:{step}")


def segment_selection(
    groups: list[Group], rule: str, per_task: int, rng: random.Random
) -> tuple[list[list[Segment]], dict[str, float]]:
    """`algorithm.selection` (not "all"): per group (in order, one rng), the segments that train
    (memrl.algorithms.selection.select_segments). Returns (selected segments per group, dcpo/* metrics;
    `dcpo/repeated` counts rows that repeat a segment already selected, which only "published" makes)."""
    chosen = select_segments(groups, rule, per_task, rng)
    trajs = [t for g in groups for t in g.trajectories]
    available = sum(len(t.segments) for t in trajs)
    pruned = [len(t.segments) > 1 or float(t.metrics.get("prunes", 0) or 0) > 0 for t in trajs]
    selected = sum(len(c) for c in chosen)
    metrics = {
        "dcpo/segments_per_trajectory": available / len(trajs) if trajs else 0.0,
        "dcpo/selected": float(selected),
        "dcpo/available": float(available),
        "dcpo/repeated": float(selected - sum(len({id(s) for s in c}) for c in chosen)),
        "dcpo/pruned_share": statistics.fmean(pruned) if pruned else 0.0,
    }
    return chosen, metrics
