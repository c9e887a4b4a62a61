"""The update schedule (memrl.training.step.schedule): which rows each optimizer step of an RL step trains.

Expected rows are written out by hand from the published rules (memrl/training/step/schedule.py cites them):
verl's multi-conversation batch is turn-major with the final answers last, and td_split cuts n rows into
k slices as torch.tensor_split does (n mod k slices of ceil(n/k) first); slime steps every r rows.
"""

from __future__ import annotations

from memrl.training.step.schedule import even_slices, optimizer_steps, turn_major
from memrl.types import Segment

# 4 groups x 2 trajectories; m = a memory call, f = the final answer. Row counts differ (3, 2, 4, 1, 2, 3,
# 2, 2 = 19 rows); trajectory 1b read nothing (final answer only).
SHAPES = {"0a": 2, "0b": 1, "1a": 3, "1b": 0, "2a": 1, "2b": 2, "3a": 1, "3b": 1}  # memory calls


def _seg(name: str, final: bool) -> Segment:
    return Segment([1], [2], [-0.5], trajectory_id=name.split(".")[0],
                   info={"kind": "final" if final else "memory", "name": name})


def _batch() -> list[list[Segment]]:
    groups = []
    for g in "0123":
        segs = []
        for t in (g + "a", g + "b"):
            segs += [_seg(f"{t}.m{i}", False) for i in range(SHAPES[t])] + [_seg(f"{t}.f", True)]
        groups.append(segs)
    return groups


def _names(steps: list[list[Segment]]) -> list[str]:
    return [" ".join(s.info["name"] for s in step) for step in steps]


def test_batch_order_is_groups_then_trajectories():
    assert _names(optimizer_steps(_batch())) == [
        "0a.m0 0a.m1 0a.f 0b.m0 0b.f 1a.m0 1a.m1 1a.m2 1a.f 1b.f 2a.m0 2a.f 2b.m0 2b.m1 2b.f 3a.m0 3a.f 3b.m0 3b.f"]


def test_groups_split_takes_every_kth_group():
    # mini_batches=2: groups 0 and 2, then groups 1 and 3 (10 + 9 rows)
    assert _names(optimizer_steps(_batch(), 2, "groups")) == [
        "0a.m0 0a.m1 0a.f 0b.m0 0b.f 2a.m0 2a.f 2b.m0 2b.m1 2b.f",
        "1a.m0 1a.m1 1a.m2 1a.f 1b.f 3a.m0 3a.f 3b.m0 3b.f",
    ]
    # more mini-batches than groups: the empty ones are no steps at all
    assert len(optimizer_steps(_batch(), 6, "groups")) == 4


def test_verl_row_order_is_turn_major_with_finals_last():
    # turn 0 of every trajectory that read (1b did not), turn 1 of 0a 1a 2b, turn 2 of 1a, then the 8 finals
    assert " ".join(s.info["name"] for s in turn_major(_batch())) == (
        "0a.m0 0b.m0 1a.m0 2a.m0 2b.m0 3a.m0 3b.m0 0a.m1 1a.m1 2b.m1 1a.m2 "
        "0a.f 0b.f 1a.f 1b.f 2a.f 2b.f 3a.f 3b.f")


def test_rows_split_is_tensor_split_of_the_verl_order():
    # 19 rows into 4 slices: 19 = 4 * 4 + 3, so three slices of 5, then one of 4
    assert _names(optimizer_steps(_batch(), 4, "rows")) == [
        "0a.m0 0b.m0 1a.m0 2a.m0 2b.m0",
        "3a.m0 3b.m0 0a.m1 1a.m1 2b.m1",
        "1a.m2 0a.f 0b.f 1a.f 1b.f",
        "2a.f 2b.f 3a.f 3b.f",
    ]
    # 2 slices: 10 then 9
    assert [len(s) for s in optimizer_steps(_batch(), 2, "rows")] == [10, 9]
    # published shape: 128 prompts x 16 samples x 3 rows = 6144 rows into 16 slices of 384
    assert [len(s) for s in even_slices(list(range(6144)), 16)] == [384] * 16


def test_rows_split_as_a_multi_rank_verl_run_cuts_it():
    # trainer.mini_batch_ranks=3: recurrent/utils.py graceful_padding(19, 3): group size 19 // 3 + 1 = 7,
    # 19 mod 3 = 1 group without padding, so rank 0 holds rows 0-6 and ranks 1 and 2 a padding row (masked
    # out again) + rows 7-12 and 13-18; each rank td_splits its share into 2: 7 -> 4 + 3, 6 -> 3 + 3.
    # Step j trains slice j of every rank.
    assert _names(optimizer_steps(_batch(), 2, "rows", ranks=3)) == [
        "0a.m0 0b.m0 1a.m0 2a.m0 0a.m1 1a.m1 2b.m1 1a.f 1b.f 2a.f",
        "2b.m0 3a.m0 3b.m0 1a.m2 0a.f 0b.f 2b.f 3a.f 3b.f",
    ]
    # one rank: the whole batch cut at once (10 + 9 rows, other rows per step)
    assert _names(optimizer_steps(_batch(), 2, "rows"))[0] == (
        "0a.m0 0b.m0 1a.m0 2a.m0 2b.m0 3a.m0 3b.m0 0a.m1 1a.m1 2b.m1")
    # more ranks than rows for some slices: a step takes what the shares have (verl would refuse)
    assert sum(len(s) for s in optimizer_steps(_batch(), 4, "rows", ranks=8)) == 19


def test_rows_split_with_fewer_rows_than_slices_trains_each_row_alone():
    two = [[_seg("0a.m0", False), _seg("0a.f", True)]]
    assert _names(optimizer_steps(two, 4, "rows")) == ["0a.m0", "0a.f"]


def test_every_k_rows_cuts_the_batch_order():
    # 19 rows every 8: 8, 8, then the remaining 3
    assert _names(optimizer_steps(_batch(), 1, "groups", every_rows=8)) == [
        "0a.m0 0a.m1 0a.f 0b.m0 0b.f 1a.m0 1a.m1 1a.m2",
        "1a.f 1b.f 2a.m0 2a.f 2b.m0 2b.m1 2b.f 3a.m0",
        "3a.f 3b.m0 3b.f",
    ]


def test_every_row_is_trained_exactly_once_under_every_rule():
    want = sorted(s.info["name"] for g in _batch() for s in g)
    for kw in ({}, {"mini_batches": 3}, {"mini_batches": 3, "split": "rows"}, {"every_rows": 5},
               {"mini_batches": 3, "split": "rows", "ranks": 4}):
        got = sorted(s.info["name"] for step in optimizer_steps(_batch(), **kw) for s in step)
        assert got == want, kw


def test_mini_batch_ranks_needs_the_rows_split():
    import pytest

    from memrl.config import ConfigError, load_config
    from memrl.training.config import TrainConfig

    with pytest.raises(ConfigError, match="trainer.mini_batch_ranks=4 .* needs trainer.mini_batch_split=rows"):
        load_config(TrainConfig, ["model.path=x", "trainer.mini_batch_ranks=4", "trainer.batch_size=4",
                                  "trainer.mini_batches=2"]).check()
    load_config(TrainConfig, ["model.path=x", "trainer.mini_batch_ranks=4", "trainer.batch_size=4",
                              "trainer.mini_batches=2", "trainer.mini_batch_split=rows"]).check()
