"""Which groups and segments train: DAPO dynamic sampling and MemAct's DCPO segment sampling."""

from __future__ import annotations

import random
from collections.abc import Sequence

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


def dcpo_select_segments(
    group: Group, n: int, rng: random.Random, allow_repeats: bool = False
) -> list[Segment]:
    """DCPO segment sampling (MemAct): n segments of the group, one per trajectory first, then round-robin.

    Trajectories are visited in one rng-shuffled order (so with more trajectories than n, a random n
    get one segment each). Each visit takes a uniformly random segment of that trajectory not taken
    yet; trajectories with none left are skipped. When every segment is taken before n is reached,
    fewer than n segments come back (the default: a repeated row would silently double its weight);
    with `allow_repeats=True` the round-robin goes on, drawing from all of a trajectory's segments.
    Deterministic given the rng state.
    """
    if n < 0:
        raise ValueError(f"dcpo_select_segments: n must be >= 0, got {n}")
    trajs = [t for t in group.trajectories if t.segments]
    if not trajs or n == 0:
        return []
    order = list(range(len(trajs)))
    rng.shuffle(order)
    unused = {i: list(range(len(trajs[i].segments))) for i in order}
    chosen: list[Segment] = []
    while len(chosen) < n:
        progressed = False
        for i in order:
            if len(chosen) == n:
                break
            pool = unused[i]
            if pool:
                j = pool.pop(rng.randrange(len(pool)))
            elif allow_repeats and not any(unused.values()):
                j = rng.randrange(len(trajs[i].segments))
            else:
                continue
            chosen.append(trajs[i].segments[j])
            progressed = True
        if not progressed:
            break
    return chosen
