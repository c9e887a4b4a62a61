"""Copy warm-up rows (memrl.training.sft.copy_warmup_segments) and the SFT options it trains with."""

from __future__ import annotations

import pytest

from memrl.training.sft import copy_warmup_segments, lr_factor


def test_rows_are_a_sequence_then_itself_trained_on_the_repeat():
    rows = copy_warmup_segments([5, 6, 7], rows=6, min_len=2, max_len=5, block=3, seed=1)
    assert len(rows) == 6
    for r in rows:
        seq = r.prompt_ids[:-1]
        n = len(seq)
        assert 2 <= n <= 5 and set(seq) <= {5, 6, 7}
        assert r.prompt_ids[-1] == seq[0] and r.response_ids == seq[1:]  # the repeat; its first token is context
        assert r.loss_mask == [1] * (n - 1) and r.response_logprobs == [0.0] * (n - 1)
    # blocks of three share a length (unshuffled batches of three need no padding)
    lens = [len(r.prompt_ids) for r in rows]
    assert lens[0] == lens[1] == lens[2] and lens[3] == lens[4] == lens[5]
    again = copy_warmup_segments([5, 6, 7], rows=6, min_len=2, max_len=5, block=3, seed=1)
    assert [r.prompt_ids + r.response_ids for r in again] == [r.prompt_ids + r.response_ids for r in rows]
    with pytest.raises(ValueError, match="min_len"):
        copy_warmup_segments([5], rows=1, min_len=1)
    with pytest.raises(ValueError, match="block"):
        copy_warmup_segments([5], rows=1, block=0)


def test_lr_floor_one_keeps_the_rate_constant_after_warmup():
    assert lr_factor(0, 4, 100, floor=1.0) == 0.25
    assert [lr_factor(s, 4, 100, floor=1.0) for s in (4, 50, 99)] == [1.0, 1.0, 1.0]
    assert lr_factor(100, 4, 100, floor=0.1) == pytest.approx(0.1)
