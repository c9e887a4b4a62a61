"""Task-balanced sampling over a data mixture (QwenLong-L1.5): the per-kind counts, the published refill,
and the training task stream that uses it; expected values by hand."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from memrl.config import ConfigError, load_config
from memrl.data.mixture import balanced_batches, balanced_counts
from memrl.data.tasks_jsonl import write_tasks
from memrl.errors import UserError
from memrl.training.assemble import task_stream
from memrl.training.config import TrainConfig
from memrl.types import Task


def test_counts():
    # 3 kinds, batch 4: floor(4 / 3) = 1 each, the last slot to the first kind with a task to spare
    assert balanced_counts([3, 2, 1], 4) == [2, 1, 1]
    # batch 8 over sizes [1, 5, 5]: 8 // 3 = 2 -> [1 (capped), 2, 2], 3 left: kind 1, kind 2, kind 1 -> [1, 4, 3]
    assert balanced_counts([1, 5, 5], 8) == [1, 4, 3]
    with pytest.raises(ValueError, match="needs more tasks than the 3"):
        balanced_counts([2, 1], 4)


def test_batches_in_file_order_show_the_published_refill():
    # kinds a a a b b c, batch 4: counts a 2, b 1, c 1.
    # batch 0: a [0, 1] (left [2]), b [3] (left [4]), c [5];
    # batch 1: a needs 2, has 1: [2] is discarded, a refilled [0, 1, 2] -> [0, 1]; b [4]; c refilled -> [5]
    # batch 2: a refilled again -> [0, 1]; b refilled [3, 4] -> [3]; c [5]
    got = list(itertools.islice(balanced_batches(list("aaabbc"), 4, seed=0, shuffle=False), 3))
    assert got == [[0, 1, 3, 5], [0, 1, 4, 5], [0, 1, 3, 5]]


def test_shuffled_batches_are_balanced_and_seeded():
    kinds = list("aaaaaabbbbcc")
    a = list(itertools.islice(balanced_batches(kinds, 6, seed=3), 5))
    assert a == list(itertools.islice(balanced_batches(kinds, 6, seed=3), 5))
    for batch in a:  # 6 // 3 = 2 of each kind, no task twice in a batch
        assert Counter(kinds[i] for i in batch) == {"a": 2, "b": 2, "c": 2} and len(set(batch)) == 6
    assert a != list(itertools.islice(balanced_batches(kinds, 6, seed=4), 5))


def _file(tmp_path, kinds: str):
    path = tmp_path / "mix.jsonl"
    write_tasks(path, [Task(f"t{i}", "q", "c", ["a"], {"data_source": k}) for i, k in enumerate(kinds)])
    return path


def test_training_stream_draws_balanced_batches(tmp_path):
    path = _file(tmp_path, "aaaaab")
    cfg = load_config(TrainConfig, ["data.name=file", f"data.path={path}", "data.sampling=task_balanced",
                                    "data.shuffle=false", "trainer.batch_size=2", "model.path=x"])
    cfg.check()
    # a: 1, b: 1 per batch, in file order: t0 t5 | t1 t5 | t2 t5 ...; ids carry the batch
    got = [t.task_id for t in itertools.islice(task_stream(cfg, 0), 6)]
    assert got == ["t0@b0", "t5@b0", "t1@b1", "t5@b1", "t2@b2", "t5@b2"]
    assert [t.task_id for t in itertools.islice(task_stream(cfg, 3), 2)] == ["t5@b1", "t2@b2"]  # resume


def test_refusals(tmp_path):
    with pytest.raises(ConfigError, match="data.sampling=task_balanced needs data.name=file"):
        load_config(TrainConfig, ["data.sampling=task_balanced", "model.path=x"]).check()
    path = tmp_path / "plain.jsonl"
    write_tasks(path, [Task("t0", "q", "c", ["a"])])
    cfg = load_config(TrainConfig, ["data.name=file", f"data.path={path}", "data.sampling=task_balanced",
                                    "trainer.batch_size=1", "model.path=x"])
    with pytest.raises(UserError, match="task t0 of .* has no 'data_source'"):
        next(task_stream(cfg, 0))
