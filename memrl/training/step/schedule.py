"""The update schedule: which of a batch's rows each optimizer step of one RL step trains.

Three rules (`trainer.*`), each returning the rows of every optimizer step, in order:

- `mini_batches=k, mini_batch_split=groups` (memrl's default, k=1 the whole batch): whole groups, group i
  to step i mod k, each group's rows in trajectory order.
- `mini_batches=k, mini_batch_split=rows`: the rule of the MemAgent and ReMemR1 verl forks. Their rollout
  concatenates the model calls turn by turn (every sample's first call, then the second call of the samples
  still reading, ...; the final answers of all samples last: recurrent/generation_manager.py run_llm_loop,
  the sample_index diagram in ray_trainer.py fit), and the actor cuts that batch into
  train_batch_size // ppo_mini_batch_size contiguous slices with torch.tensor_split
  (dp_actor.update_policy -> recurrent/utils.py td_split): n rows into k slices are n mod k slices of
  ceil(n/k) rows, then slices of floor(n/k). verl refuses fewer rows than slices; here each row is then a
  step of its own. With `mini_batch_ranks=W` (the published run's data-parallel size), the cut of a
  W-rank verl run: its trainer pads the batch so each rank gets a contiguous share of the turn-major rows
  (recurrent/utils.py graceful_padding: tensor_split sizes, the padding masked out again in
  dp_actor.update_policy), each rank cuts ITS share into k slices, and optimizer step j trains slice j of
  every share (the gradients are all-reduced). This is a property of the published run, not of memrl's
  own ranks: any trainer.num_workers gives the same rows per step.
- `mini_batch_rows=r` (vime on slime, --global-batch-size): one step every r rows in batch order (each
  trajectory's calls together, groups in order); a last slice of fewer rows is a step of its own
  (`tail="step"`), or is left out (`tail="drop"`: vime's custom_convert trims the rows to a multiple of
  r, keeping a batch of fewer than r rows whole).

Each step's loss is normalized over its own rows (verl scales each micro-batch by its share of the
mini-batch's tokens or rows, so the mini-batch loss is the token- or sequence-mean of that mini-batch).
With `trainer.loss_weights=per_rank` it is normalized over each rank's slice instead (`rank_steps` gives
the slices; memrl.training.update.packing.weigh_shares), as the MemAgent / ReMemR1 forks do at world size W.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from memrl.types import Segment

T = TypeVar("T")


def even_slices(items: Sequence[T], k: int) -> list[list[T]]:
    """`items` cut into min(k, len) contiguous slices as torch.tensor_split cuts them: the first
    len mod k slices hold one item more."""
    k = max(1, min(k, len(items)))
    size, extra = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def turn_major(per_group: Sequence[Sequence[Segment]]) -> list[Segment]:
    """The rows in verl's multi-conversation order: trajectories in batch order (groups, then their
    trajectories); every trajectory's first non-final call, then every second one, ...; then every final
    answer (a segment whose info kind is "final")."""
    keyed = []
    traj_rank: dict[str, int] = {}
    for segs in per_group:
        turn: dict[str, int] = {}
        for s in segs:
            tid = s.trajectory_id
            rank = traj_rank.setdefault(tid, len(traj_rank))
            final = s.info.get("kind") == "final"
            t = 0 if final else turn.get(tid, 0)
            if not final:
                turn[tid] = t + 1
            keyed.append(((final, t, rank), len(keyed), s))
    return [s for *_, s in sorted(keyed, key=lambda x: (x[0], x[1]))]


def rank_steps(per_group: Sequence[Sequence[Segment]], mini_batches: int = 1,
               ranks: int = 1) -> list[list[list[Segment]]]:
    """split "rows" with `ranks` shares: for each optimizer step, the slice of every rank's share it trains
    (one list per rank, in rank order; empty where a share has fewer rows than steps). Steps whose every
    slice is empty are left out."""
    shares = [even_slices(share, mini_batches) for share in even_slices(turn_major(per_group), ranks)]
    steps = [[share[j] if j < len(share) else [] for share in shares] for j in range(max(1, mini_batches))]
    return [step for step in steps if any(step)]


def optimizer_steps(per_group: Sequence[Sequence[Segment]], mini_batches: int = 1, split: str = "groups",
                    every_rows: int = 0, tail: str = "step", ranks: int = 1) -> list[list[Segment]]:
    """The segments each optimizer step trains, in order (`per_group`: the trained segments of each group,
    in batch order). Empty steps are left out. `tail` ("step" | "drop") applies to `every_rows` only;
    `ranks` (the published run's data-parallel size) to split "rows" only."""
    if every_rows > 0:
        rows = [s for segs in per_group for s in segs]
        if tail == "drop":  # vime: (total // r) * r rows, all of them when that is 0
            rows = rows[: (len(rows) // every_rows) * every_rows or len(rows)]
        elif tail != "step":
            raise ValueError(f"unknown mini-batch tail {tail!r}; known: step, drop")
        return [rows[i : i + every_rows] for i in range(0, len(rows), every_rows)]
    if split == "rows":
        steps = [[s for share in step for s in share] for step in rank_steps(per_group, mini_batches, ranks)]
        return [p for p in steps if p]
    if split != "groups":
        raise ValueError(f"unknown mini-batch split {split!r}; known: groups, rows")
    parts = [[s for segs in per_group[i::mini_batches] for s in segs] for i in range(max(1, mini_batches))]
    return [p for p in parts if p]
