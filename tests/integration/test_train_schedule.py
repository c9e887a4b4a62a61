"""The update schedule and the gradient clip on the tiny model (CPU): optimizer steps per RL step, each
mini-batch normalized over its own rows, one learning-rate step per RL step, data order, grad_clip 0."""

from __future__ import annotations

import json

import pytest
import torch

from memrl.config import load_config
from memrl.training.assemble import assemble, task_stream
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _cfg(model: str, out, steps: int, *extra: str) -> TrainConfig:
    ov = [f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memagent",
          "workflow.chunk_tokens=24", "workflow.max_memory_tokens=4", "workflow.max_final_tokens=2",
          "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2",
          "algorithm.kl_coef=0", "optim.lr=1e-3", "optim.warmup_steps=4", "trainer.save_every=0",
          "trainer.token_budget=4096", "trainer.progress=false", "trainer.tensorboard=false",
          "trainer.skip_zero_advantage=false", *extra]
    return load_config(TrainConfig, ov)


class _Recording(Trainer):
    """Keeps the weighed rows of every optimizer step (one loss weight per row, fixed by the trainer)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, list, bool]] = []  # (RL step, rows, step_scheduler)

    def train_rows(self, batch, step_scheduler=True):
        self.calls.append((self.step, batch, step_scheduler))
        return super().train_rows(batch, step_scheduler)


def _adam_steps(trainer) -> int:
    """Optimizer steps taken: AdamW counts them per parameter."""
    states = [s["step"] for s in trainer.parts.workers.opt.state.values()]
    assert states and len({float(s) for s in states}) == 1
    return int(states[0])


def test_rows_split_makes_two_optimizer_steps_per_batch(tiny_path, tmp_path):
    trainer = _Recording(assemble(_cfg(tiny_path, tmp_path / "r", 2, "trainer.mini_batches=2",
                              "trainer.mini_batch_split=rows")))
    history = trainer.fit()
    # 2 tasks x 2 samples x (1 memory call + 1 final; the 16-word documents fit one 24-token chunk) = 8 rows
    # per batch, cut into 4 + 4
    assert [(s, len(rows), sched) for s, rows, sched in trainer.calls] == \
        [(0, 4, False), (0, 4, True), (1, 4, False), (1, 4, True)]
    assert _adam_steps(trainer) == 4
    assert trainer.parts.workers.sched.last_epoch == 2  # the learning-rate schedule counts RL steps
    for h in history:
        assert h["train/optimizer_steps"] == 2 and h["train/rows"] == 8
    # warm-up of 4 RL steps: the lr after RL step k is lr * (k + 1) / 4
    assert [h["train/lr"] for h in history] == pytest.approx([1e-3 * 2 / 4, 1e-3 * 3 / 4])
    for _, batch, _ in trainer.calls:  # token-mean over each mini-batch's own rows
        assert sum(w * sum(s.loss_mask) for s, w in zip(batch.segments, batch.weights, strict=True)) == \
            pytest.approx(1.0)
        assert batch.weight_sum() == pytest.approx(1.0)
    # verl's order (turn-major, finals last): the first slice is the 4 trajectories' memory calls, the second
    # their 4 final answers
    for s in (0, 2):
        first, second = trainer.calls[s][1].segments, trainer.calls[s + 1][1].segments
        assert len({r.trajectory_id for r in first}) == 4 == len({r.trajectory_id for r in second})


def test_per_rank_loss_weights_take_each_rank_slice_token_mean(tiny_path, tmp_path):
    trainer = _Recording(assemble(_cfg(tiny_path, tmp_path / "w", 1, "trainer.mini_batches=2",
                                       "trainer.mini_batch_split=rows", "trainer.mini_batch_ranks=2",
                                       "trainer.loss_weights=per_rank")))
    (h,) = trainer.fit()
    assert h["train/optimizer_steps"] == 2
    # 8 rows in verl's order: the 4 memory calls, then the 4 finals. W = 2: rank 0 holds the memory calls,
    # rank 1 the finals; each cuts its 4 rows into 2 + 2, so step j trains 2 memory calls + 2 finals, and a
    # row weighs 1 / (2 x trained tokens of the 2 rows of its kind in that step).
    for _, batch, _ in trainer.calls:
        kinds = [s.info["kind"] for s in batch.segments]
        assert kinds == ["memory", "memory", "final", "final"]
        for rows, weights in ((batch.segments[:2], batch.weights[:2]), (batch.segments[2:], batch.weights[2:])):
            n = sum(sum(s.loss_mask) for s in rows)
            assert weights == pytest.approx([1 / (2 * n)] * 2)
        assert batch.weight_sum() == pytest.approx(1.0)


def test_rows_every_k_and_default_schedules(tiny_path, tmp_path):
    every = _Recording(assemble(_cfg(tiny_path, tmp_path / "e", 1, "trainer.mini_batch_rows=5")))
    (h,) = every.fit()
    assert [len(rows) for _, rows, _ in every.calls] == [5, 3] and h["train/optimizer_steps"] == 2
    assert _adam_steps(every) == 2 and every.parts.workers.sched.last_epoch == 1
    plain = _Recording(assemble(_cfg(tiny_path, tmp_path / "p", 1)))
    (h,) = plain.fit()
    assert [len(rows) for _, rows, _ in plain.calls] == [8] and _adam_steps(plain) == 1


def test_file_order_without_shuffle(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"q{i}", "question": "?", "context": "c", "answers": ["a"]}) + "\n"
                            for i in range(5)))
    base = [f"data.path={path}", "data.name=file"]
    ids = [t.task_id for t, _ in zip(task_stream(load_config(TrainConfig, [*base, "data.shuffle=false"]), 0),
                                     range(12), strict=False)]
    assert ids == [f"q{i}@e{e}" for e in range(3) for i in range(5)][:12]
    shuffled = [t.task_id for t, _ in zip(task_stream(load_config(TrainConfig, base), 0), range(5), strict=False)]
    assert sorted(shuffled) == [f"q{i}@e0" for i in range(5)] and shuffled != [f"q{i}@e0" for i in range(5)]


def _rows(vocab: int):
    import random

    from memrl.types import Segment

    rng = random.Random(5)
    out = []
    for i in range(6):
        n = rng.randint(3, 9)
        out.append(Segment([rng.randrange(vocab) for _ in range(8)], [rng.randrange(vocab) for _ in range(n)],
                           [-rng.uniform(1.0, 8.0) for _ in range(n)], advantage=rng.choice((-1.0, 1.0)),
                           trajectory_id=f"t{i}"))
    return out


def test_grad_clip_zero_means_no_clipping_never_a_frozen_or_reversed_update(tiny_path, tmp_path):
    from transformers import AutoConfig

    from memrl.training.ranks.workers import PolicyWorker
    from memrl.training.update.packing import weigh

    vocab = AutoConfig.from_pretrained(tiny_path).vocab_size
    rows = _rows(vocab)
    moved = {}
    for clip in ("0", "1000", "1e-3"):  # 1000: optim.grad_clip's upper bound
        torch.manual_seed(0)
        w = PolicyWorker(load_config(TrainConfig, [f"model.path={tiny_path}", "algorithm.kl_coef=0", "optim.lr=1e-3",
                                                   "optim.warmup_steps=0", f"optim.grad_clip={clip}"]))
        before = {k: v.clone() for k, v in w.model.state_dict().items()}
        m = w.train_rows(weigh(rows, "token-mean"))
        moved[clip] = {k: v - before[k] for k, v in w.model.state_dict().items()}
        assert 1e-3 < m["train/grad_norm"] < 1000  # so the clip at 1000 is one no gradient reaches
    # 0 = no clipping: the same update as a clip no gradient reaches, and it moves the weights
    for k, d in moved["0"].items():
        assert torch.equal(d, moved["1000"][k]), k
    assert max(float(d.abs().max()) for d in moved["0"].values()) > 1e-4
    # a tight positive clip still moves the weights the same way (Adam's first step is sign-like)
    dot = sum(float((moved["0"][k] * moved["1e-3"][k]).sum()) for k in moved["0"])
    assert dot > 0
