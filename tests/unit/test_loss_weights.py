"""trainer.loss_weights=per_rank: the loss weights of the MemAgent / ReMemR1 verl forks at world size W.

The fork's rule (verl/workers/actor/dp_actor.py update_policy, read at MemAgent commit 76b7a658; ReMemR1's
copy is the same): each rank cuts its own share into mini-batches; within mini-batch j a micro-batch's loss
is agg_loss over the micro-batch times (its trained tokens / the rank's mini-batch trained tokens) under
token-mean (times its rows / the rank's mini-batch rows under the seq modes), the micro-batch gradients are
summed, and FSDP averages the ranks' gradients. So a row's weight is 1 / (W x trained tokens of its rank's
slice), whatever the micro-batching. Expected weights below are worked out by hand.
"""

from __future__ import annotations

import random

import pytest
import torch

from memrl.algorithms.losses import row_weights
from memrl.training.step.schedule import optimizer_steps, rank_steps
from memrl.training.update.packing import weigh, weigh_shares
from memrl.types import Segment

# Six single-call trajectories (final answers only, so verl's turn-major order is the batch order), with
# 3, 1, 2, 4, 2, 5 trained tokens (each row has one masked-out token besides).
TOKENS = [3, 1, 2, 4, 2, 5]


def _row(i: int, n: int) -> Segment:
    return Segment([1], [2] * (n + 1), [-0.5] * (n + 1), loss_mask=[0] + [1] * n, trajectory_id=f"t{i}",
                   info={"kind": "final", "name": f"r{i}"})


def _batch() -> list[list[Segment]]:
    return [[_row(i, n) for i, n in enumerate(TOKENS)]]


def _names(rows) -> list[str]:
    return [s.info["name"] for s in rows]


def test_rank_slices_of_two_ranks_and_two_steps():
    # W = 2: rank 0 holds r0-r2, rank 1 r3-r5 (6 rows, 3 each); each cuts its share into 2: 2 + 1.
    steps = rank_steps(_batch(), 2, 2)
    assert [[_names(sl) for sl in step] for step in steps] == [[["r0", "r1"], ["r3", "r4"]], [["r2"], ["r5"]]]
    # the rows per step are optimizer_steps' (the split is shared)
    assert [[s for sl in step for s in sl] for step in steps] == optimizer_steps(_batch(), 2, "rows", ranks=2)


def test_token_mean_weights_per_rank_by_hand():
    w = [weigh_shares(shares, "token-mean", 2) for shares in rank_steps(_batch(), 2, 2)]
    # step 0: rank 0 slice r0 + r1 = 3 + 1 = 4 tokens -> 1 / (2 x 4) = 1/8 each;
    #         rank 1 slice r3 + r4 = 4 + 2 = 6 tokens -> 1 / (2 x 6) = 1/12 each
    # step 1: rank 0 slice r2 = 2 tokens -> 1/4; rank 1 slice r5 = 5 tokens -> 1/10
    assert _names(w[0].segments) == ["r0", "r1", "r3", "r4"]
    assert w[0].weights == pytest.approx([1 / 8, 1 / 8, 1 / 12, 1 / 12])
    assert w[1].weights == pytest.approx([1 / 4, 1 / 10])
    # memrl's rule on the same rows: one token mean over the step, 1 / (3 + 1 + 4 + 2) and 1 / (2 + 5)
    plain = [weigh(rows, "token-mean") for rows in optimizer_steps(_batch(), 2, "rows", ranks=2)]
    assert plain[0].weights == pytest.approx([1 / 10] * 4) and plain[1].weights == pytest.approx([1 / 7] * 2)
    # each share's token mean weighs 1/W: the weights still sum to 1 over the trained tokens
    assert [b.weight_sum() for b in w] == pytest.approx([1.0, 1.0])


def test_seq_mean_token_mean_weights_per_rank_by_hand():
    (step0, _) = [weigh_shares(shares, "seq-mean-token-mean", 2) for shares in rank_steps(_batch(), 2, 2)]
    # 1 / (W x rows of the slice x the row's tokens): r0 1/(2*2*3), r1 1/(2*2*1), r3 1/(2*2*4), r4 1/(2*2*2)
    assert step0.weights == pytest.approx([1 / 12, 1 / 4, 1 / 16, 1 / 8])


def test_one_rank_is_memrls_rule():
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "traj-mean"):
        for shares, rows in zip(rank_steps(_batch(), 2, 1), optimizer_steps(_batch(), 2, "rows"), strict=True):
            assert weigh_shares(shares, mode, 1).weights == pytest.approx(weigh(rows, mode).weights)


def test_a_slice_without_trained_tokens_weighs_zero():
    # the fork divides by the slice's 0 tokens there (0 / 0); memrl gives its rows weight 0
    rows = [[_row(0, 2), Segment([1], [2], [-0.5], loss_mask=[0], trajectory_id="t1", info={"kind": "final"})]]
    (step,) = [weigh_shares(shares, "token-mean", 2) for shares in rank_steps(rows, 1, 2)]
    assert step.weights == pytest.approx([1 / 4, 0.0])


def _fork_loss(slices: list[list[torch.Tensor]], world: int) -> torch.Tensor:
    """One optimizer step as the fork computes it, token-mean: `slices[r]` = rank r's micro-batches, each a
    list of per-token losses of its trained tokens (one 1-D tensor per micro-batch). A micro-batch's
    masked mean (with verl's + 1e-8 in the denominator) times its tokens / the rank's tokens, summed over
    micro-batches, then the mean over the W ranks (FSDP's gradient average)."""
    total = torch.zeros((), dtype=torch.float64)
    for micro in slices:
        rank_tokens = sum(m.numel() for m in micro)
        for m in micro:
            total = total + m.sum() / (m.numel() + 1e-8) * (m.numel() / rank_tokens)
    return total / world


def test_weights_reproduce_the_forks_loss_under_any_micro_batching():
    rng = random.Random(0)
    (step0, _) = rank_steps(_batch(), 2, 2)
    losses = {s.info["name"]: torch.tensor([rng.uniform(-1, 1) for _ in range(sum(s.loss_mask))],
                                           dtype=torch.float64) for sl in step0 for s in sl}
    batch = weigh_shares(step0, "token-mean", 2)
    ours = sum(w * losses[s.info["name"]].sum() for s, w in zip(batch.segments, batch.weights, strict=True))
    # rank 0's slice as one micro-batch or as two (r0 | r1): the same loss (the scale cancels the mean)
    one = _fork_loss([[torch.cat([losses["r0"], losses["r1"]])], [torch.cat([losses["r3"], losses["r4"]])]], 2)
    two = _fork_loss([[losses["r0"], losses["r1"]], [losses["r3"], losses["r4"]]], 2)
    assert float(ours) == pytest.approx(float(one), rel=1e-7) and float(ours) == pytest.approx(float(two), rel=1e-7)
    # and differs from memrl's token mean over the whole step (10 tokens) with these uneven slices
    plain = sum(losses[n].sum() for n in ("r0", "r1", "r3", "r4")) / 10
    assert abs(float(plain) - float(ours)) > 1e-3


def test_row_weights_unchanged_for_the_whole_batch():
    # weigh_shares with one share and W = 1 is row_weights itself
    masks = [s.loss_mask for s in _batch()[0]]
    assert weigh_shares([_batch()[0]], "token-mean", 1).weights == row_weights(masks)


def test_per_rank_needs_the_rows_split():
    from memrl.config import ConfigError, load_config
    from memrl.training.config import TrainConfig

    base = ["model.path=x", "trainer.batch_size=4", "trainer.mini_batches=2", "trainer.loss_weights=per_rank"]
    with pytest.raises(ConfigError, match="trainer.loss_weights=per_rank .* needs trainer.mini_batch_split=rows"):
        load_config(TrainConfig, base).check()
    with pytest.raises(ConfigError, match="loss_weights"):
        load_config(TrainConfig, ["model.path=x", "trainer.loss_weights=rank"])
    load_config(TrainConfig, [*base, "trainer.mini_batch_split=rows", "trainer.mini_batch_ranks=2"]).check()
