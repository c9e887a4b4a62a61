"""Task-balanced sampling over a data mixture (QwenLong-L1.5, after RuleReasoner's domain sampler): every
batch draws the same number of tasks from each task kind (Task.meta[data.task_key], e.g. data_source).

Per batch of B tasks over K kinds: each kind takes floor(B / K) (at most as many as it has), and the
remaining slots go one at a time to the kinds in their order of first appearance, skipping a kind that has
no more tasks than it already takes, until the batch is full. Each kind is drawn from its own shuffled
list of tasks; when fewer remain than the batch needs, the rest of that list is discarded and the kind is
reshuffled from all its tasks (the published sampler's refill). The batch is then shuffled. Without
shuffling (data.shuffle=false) the lists keep the file's order and the batch lists the kinds in order.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterator, Sequence


def balanced_counts(sizes: Sequence[int], batch_size: int) -> list[int]:
    """How many tasks of each kind (of `sizes[k]` tasks) one batch of `batch_size` takes."""
    if not sizes or batch_size < 1:
        raise ValueError(f"balanced_counts: {len(sizes)} kinds, batch size {batch_size}")
    counts = [min(batch_size // len(sizes), n) for n in sizes]
    remaining = batch_size - sum(counts)
    if remaining > sum(sizes) - sum(counts):
        raise ValueError(f"task-balanced sampling: a batch of {batch_size} needs more tasks than the "
                         f"{sum(sizes)} of the data")
    while remaining > 0:
        for k, n in enumerate(sizes):
            if remaining > 0 and n > counts[k]:
                counts[k] += 1
                remaining -= 1
    return counts


def balanced_batches(kinds: Sequence[Hashable], batch_size: int, seed: int, shuffle: bool = True
                     ) -> Iterator[list[int]]:
    """Endless batches of indices into `kinds` (one kind per task), each balanced as the module says;
    deterministic given `seed`."""
    order: list[Hashable] = list(dict.fromkeys(kinds))
    members = {k: [i for i, x in enumerate(kinds) if x == k] for k in order}
    counts = balanced_counts([len(members[k]) for k in order], batch_size)
    rng = random.Random(f"balanced:{seed}")
    pending: dict[Hashable, list[int]] = {k: [] for k in order}
    while True:
        batch: list[int] = []
        for k, c in zip(order, counts, strict=True):
            if len(pending[k]) < c:  # the published refill: the rest is discarded, the kind reshuffled
                pending[k] = list(members[k])
                if shuffle:
                    rng.shuffle(pending[k])
            batch += pending[k][:c]
            pending[k] = pending[k][c:]
        if shuffle:
            rng.shuffle(batch)
        yield batch
