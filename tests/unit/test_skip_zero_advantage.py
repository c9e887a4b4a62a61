"""`trainer.skip_zero_advantage`: rows with A = 0 leave the update without changing it.

Three workers from the same tiny model take one step each: SKIP (the default) and FULL (skipping off) on the
same 9 rows, 3 of them with advantage exactly 0; ONLY on the 6 non-zero rows alone. SKIP must equal FULL
(loss, grad norm, weights: the skipped rows add nothing and the batch's token-mean normalizer is kept) and
must log the entropy of the rows it trained, which is ONLY's (its normalizer counts those rows alone).
Tolerances: float32 sums in another order (measured differences ~1e-8 loss, ~1e-7 weights).
"""

from __future__ import annotations

import random

import pytest
import torch

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.update.packing import weigh
from memrl.types import Segment

ZERO = (1, 4, 7)


def _rows(vocab: int) -> list[Segment]:
    rng = random.Random(3)
    rows = []
    for i in range(9):
        p, n = rng.randint(3, 20), rng.randint(2, 12)
        adv = 0.0 if i in ZERO else rng.choice((-1, 1)) * rng.uniform(0.2, 1.5)
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-rng.uniform(0.5, 9.0) for _ in range(n)], advantage=adv, trajectory_id=f"t{i % 4}"))
    return rows


def _worker(model: str, tmp: str, *extra: str):
    from memrl.training.ranks.workers import PolicyWorker

    torch.manual_seed(0)
    cfg = load_config(TrainConfig, [f"model.path={model}", f"out_dir={tmp}", "algorithm.kl_coef=0",
                                    "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=60",
                                    "trainer.progress=false", *extra])
    return PolicyWorker(cfg)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoConfig

    from memrl.models.tiny import cached_tiny_model

    model = str(cached_tiny_model("tiny"))
    return model, AutoConfig.from_pretrained(model).vocab_size


def _max_diff(a, b) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)


def test_skipping_zero_advantage_rows_leaves_the_update_unchanged(tiny, tmp_path):
    model, vocab = tiny
    rows = _rows(vocab)
    skip = _worker(model, str(tmp_path / "a"))
    full = _worker(model, str(tmp_path / "b"), "trainer.skip_zero_advantage=false")
    only = _worker(model, str(tmp_path / "c"))
    base = {k: v.clone() for k, v in skip.model.state_dict().items()}
    ms = skip.train_rows(weigh(rows, "token-mean"))
    mf = full.train_rows(weigh(rows, "token-mean"))
    mo = only.train_rows(weigh([r for i, r in enumerate(rows) if i not in ZERO], "token-mean"))

    assert ms["train/rows"] == mf["train/rows"] == 9
    assert ms["train/rows_zero_adv_skipped"] == 3 and mf["train/rows_zero_adv_skipped"] == 0
    assert mo["train/rows_zero_adv_skipped"] == 0
    assert ms["train/tokens"] == mo["train/tokens"] == mf["train/tokens"] - sum(rows[i].num_tokens for i in ZERO)
    assert abs(ms["loss/total"] - mf["loss/total"]) < 1e-7
    assert abs(ms["train/grad_norm"] - mf["train/grad_norm"]) <= 1e-5 * mf["train/grad_norm"]
    moved = max(float((v - base[k]).abs().max()) for k, v in skip.model.state_dict().items())
    assert moved > 1e-4  # the step really moved the weights
    assert _max_diff(skip.model, full.model) < 1e-6
    # logged means over the trained rows: ONLY's (normalized over the 6 rows alone); unscaled, the sum with
    # the 9-row weights would be ~2/3 of it
    assert abs(ms["loss/entropy"] - mo["loss/entropy"]) < 1e-6
    # ONLY's loss is SKIP's scaled by the token counts (token-mean over 6 rows instead of 9)
    n_all = sum(len(r.response_ids) for r in rows)
    n_kept = n_all - sum(len(rows[i].response_ids) for i in ZERO)
    assert abs(mo["loss/total"] - ms["loss/total"] * n_all / n_kept) < 1e-7


def test_no_skipping_where_it_would_not_be_exact(tiny, tmp_path):
    """An entropy or KL term has a gradient at A = 0, so those rows must train."""
    model, vocab = tiny
    for i, extra in enumerate(("algorithm.entropy_coef=0.01", "algorithm.kl_coef=0.05")):
        w = _worker(model, str(tmp_path / str(i)), extra)
        m = w.train_rows(weigh(_rows(vocab), "token-mean"))
        assert m["train/rows_zero_adv_skipped"] == 0 and m["train/rows"] == 9, extra


def test_a_mini_batch_of_zero_advantage_rows_still_takes_the_optimizer_step(tiny, tmp_path):
    """A later mini-batch whose rows all have A = 0: skipping them must still let Adam step with zero
    gradients (momentum and weight decay move the weights), exactly as the full pass does."""
    model, vocab = tiny
    rows = _rows(vocab)
    zero = weigh([rows[i] for i in ZERO], "token-mean")
    moving = weigh([r for i, r in enumerate(rows) if i not in ZERO], "token-mean")
    skip = _worker(model, str(tmp_path / "a"), "optim.weight_decay=0.1")
    full = _worker(model, str(tmp_path / "b"), "optim.weight_decay=0.1", "trainer.skip_zero_advantage=false")
    for w in (skip, full):
        w.train_rows(moving, step_scheduler=False)
        before = {k: v.clone() for k, v in w.model.state_dict().items()}
        m = w.train_rows(zero)
        assert m["train/rows"] == 3
        assert max(float((v - before[k]).abs().max()) for k, v in w.model.state_dict().items()) > 1e-5
    assert _max_diff(skip.model, full.model) < 1e-6
    steps = {float(s["step"]) for s in skip.opt.state.values()}
    assert steps == {2.0}


def test_token_level_advantages_train_and_are_never_skipped(tiny, tmp_path):
    """Segment.token_advantages (foldgrpo): a row whose token values average 0 still trains (not skipped), and
    token values all equal to a row's advantage give exactly the update of that advantage."""
    import dataclasses

    model, vocab = tiny
    rows = _rows(vocab)
    n = len(rows[1].response_ids)
    mixed = [(1.0 if k % 2 else -1.0) for k in range(n)]
    rows[1].token_advantages = mixed  # advantage stays 0.0 (a mean over tokens may be 0)
    skip = _worker(model, str(tmp_path / "a"))
    full = _worker(model, str(tmp_path / "b"), "trainer.skip_zero_advantage=false")
    ms, mf = skip.train_rows(weigh(rows, "token-mean")), full.train_rows(weigh(rows, "token-mean"))
    assert ms["train/rows_zero_adv_skipped"] == 2  # rows 4 and 7; row 1 has token values
    assert abs(ms["loss/total"] - mf["loss/total"]) < 1e-7 and _max_diff(skip.model, full.model) < 1e-6
    plain = _rows(vocab)
    tokens = [dataclasses.replace(r, token_advantages=[float(r.advantage)] * len(r.response_ids)) for r in plain]
    a, b = _worker(model, str(tmp_path / "c")), _worker(model, str(tmp_path / "d"))
    ma, mb = a.train_rows(weigh(plain, "token-mean")), b.train_rows(weigh(tokens, "token-mean"))
    assert ma["loss/total"] == mb["loss/total"] and _max_diff(a.model, b.model) == 0.0
