"""`optim.zero_grad_steps`: an optimizer step whose gradient is exactly zero (every row's advantage 0, no other
loss term) is taken ("take", the published behaviour: Adam's momentum and the weight decay still move the
weights) or skipped ("skip": the weights stay bit for bit, the learning-rate schedule still advances).

Two workers from the same tiny model train the same two mini-batches: six rows with non-zero advantages,
then three rows whose advantages are all 0. After the first both are equal; after the second TAKE has moved
(momentum of the first step) and SKIP has not moved at all.
"""

from __future__ import annotations

import random

import pytest
import torch

from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig
from memrl.training.update.packing import weigh
from memrl.types import Segment


def _rows(vocab: int, zero: bool) -> list[Segment]:
    rng = random.Random(5 if zero else 4)
    rows = []
    for _ in range(3 if zero else 6):
        p, n = rng.randint(3, 20), rng.randint(2, 12)
        adv = 0.0 if zero else rng.choice((-1, 1)) * rng.uniform(0.2, 1.5)
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-rng.uniform(0.5, 9.0) for _ in range(n)], advantage=adv, trajectory_id="t"))
    return rows


def _worker(model: str, tmp: str, *extra: str):
    from memrl.training.ranks.workers import PolicyWorker

    torch.manual_seed(0)
    cfg = load_config(TrainConfig, [f"model.path={model}", f"out_dir={tmp}", "algorithm.kl_coef=0",
                                    "optim.lr=1e-3", "optim.warmup_steps=4", "optim.weight_decay=0.1",
                                    "trainer.token_budget=60", "trainer.progress=false", *extra])
    return PolicyWorker(cfg)


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoConfig

    from memrl.models.tiny import cached_tiny_model

    model = str(cached_tiny_model("tiny"))
    return model, AutoConfig.from_pretrained(model).vocab_size


def _state(w) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in w.model.state_dict().items()}


@pytest.mark.parametrize("skip_rows", ["true", "false"])
def test_a_zero_gradient_step_is_taken_or_skipped(tiny, tmp_path, skip_rows):
    model, vocab = tiny
    moving, zero = weigh(_rows(vocab, False), "token-mean"), weigh(_rows(vocab, True), "token-mean")
    opts = (f"trainer.skip_zero_advantage={skip_rows}",)
    take = _worker(model, str(tmp_path / "take"), *opts)
    skip = _worker(model, str(tmp_path / "skip"), *opts, "optim.zero_grad_steps=skip")
    first = [w.train_rows(moving) for w in (take, skip)]
    assert first[0]["train/zero_grad_skipped"] == first[1]["train/zero_grad_skipped"] == 0.0
    assert first[0]["train/grad_norm"] > 0
    after_first = _state(skip)
    assert all(torch.equal(after_first[k], v) for k, v in _state(take).items())  # a real gradient: both step

    mt, ms = take.train_rows(zero), skip.train_rows(zero)
    assert mt["train/grad_norm"] == ms["train/grad_norm"] == 0.0
    assert mt["train/zero_grad_skipped"] == 0.0 and ms["train/zero_grad_skipped"] == 1.0
    assert all(torch.equal(after_first[k], v) for k, v in _state(skip).items())  # not one bit moved
    moved = max(float((v - after_first[k]).abs().max()) for k, v in _state(take).items())
    assert moved > 1e-5  # Adam's momentum and the weight decay moved TAKE with no gradient
    # Adam's step count: TAKE stepped twice, SKIP once; both schedules advanced twice (warm-up 1/4, 2/4, 3/4)
    assert {float(s["step"]) for s in take.opt.state.values()} == {2.0}
    assert {float(s["step"]) for s in skip.opt.state.values()} == {1.0}
    assert take.sched.get_last_lr() == skip.sched.get_last_lr() == [pytest.approx(7.5e-4, rel=1e-12)]


def test_an_unknown_value_is_refused(tiny, tmp_path):
    with pytest.raises(ConfigError, match=r"optim\.zero_grad_steps='never'"):
        load_config(TrainConfig, [f"model.path={tiny[0]}", "optim.zero_grad_steps=never"])
