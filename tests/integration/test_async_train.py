"""rollout.max_staleness end to end on the tiny model (CPU; the hf engine with its own copy of the weights,
deterministic batching): staleness 0 is the synchronous loop; at staleness 1 the batch of step 2 is what
the initial weights sample for step 2's tasks and seed (it was sampled during step 1's update), and no
trained segment is older than the bound (counted over every row that reaches the update)."""

from __future__ import annotations

import pytest
import torch
from doubles import register_parity_workflow

from memrl.config import load_config
from memrl.engines.versioned import VERSION_KEY
from memrl.training.assemble import assemble, task_stream
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

pytestmark = pytest.mark.slow

register_parity_workflow("memagent_async")

TIMING = ("time/", "perf/")


def _cfg(model: str, out, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", "trainer.steps=3", "workflow=memagent_async",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
        "data.synthetic.num_chunks=3", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=3",
        "optim.lr=1e-2", "optim.warmup_steps=0", "trainer.save_every=0", "trainer.token_budget=600",
        "trainer.progress=false", "trainer.tensorboard=false", "engine.name=hf", "engine.hf.share_weights=false",
        *extra])


class Recording(Trainer):
    """Keeps every step's sampled batch and the (version, step) of every row that reaches the update."""

    def sample_and_score(self):
        res = super().sample_and_score()
        self.batches = getattr(self, "batches", [])
        self.batches.append([[(s.response_ids, s.response_logprobs) for s in t.segments]
                             for g in res.groups for t in g.trajectories])
        return res

    def update(self, per_group, groups=None):
        self.ages = getattr(self, "ages", [])
        self.ages.extend(self.step - s.info[VERSION_KEY] if VERSION_KEY in s.info else None
                         for segs in per_group for s in segs)
        return super().update(per_group, groups)


def _fit(cfg: TrainConfig) -> tuple[Recording, list[dict[str, float]], dict[str, torch.Tensor]]:
    t = Recording(assemble(cfg))
    hist = t.fit()
    return t, hist, {k: v.detach().clone() for k, v in t.model.state_dict().items()}


def _same_batch(a, b) -> None:
    assert len(a) == len(b)
    for ta, tb in zip(a, b, strict=True):
        assert [ids for ids, _ in ta] == [ids for ids, _ in tb]
        for (_, la), (_, lb) in zip(ta, tb, strict=True):
            assert la == pytest.approx(lb, abs=1e-5)  # batches of other shapes: float32 rounding only


@pytest.fixture(scope="module")
def model() -> str:
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def test_staleness_zero_is_the_synchronous_loop(model, tmp_path):
    _, h_default, w_default = _fit(_cfg(model, tmp_path / "default"))
    t0, h_zero, w_zero = _fit(_cfg(model, tmp_path / "zero", "rollout.max_staleness=0"))
    assert t0.parts.gate is None and t0.producer is None  # no gate, no background loop
    assert all(torch.equal(w_default[k], w_zero[k]) for k in w_default)
    for a, b in zip(h_default, h_zero, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(TIMING)} == {
            k: v for k, v in b.items() if not k.startswith(TIMING)}
    assert not any(k.startswith("async/") for k in h_zero[0])


def test_staleness_one_samples_ahead_on_the_old_weights(model, tmp_path):
    sync, _, _ = _fit(_cfg(model, tmp_path / "sync"))
    run, hist, _ = _fit(_cfg(model, tmp_path / "async", "rollout.max_staleness=1"))
    # what the initial weights sample for step 2 (tasks 2-3, step 2's seed): a synchronous trainer, not trained
    probe = Recording(assemble(_cfg(model, tmp_path / "probe")))
    try:
        probe.state.step, probe.state.position = 1, 2
        probe.parts.stream = task_stream(probe.cfg, 2)
        probe.sample_and_score()
    finally:
        probe.close()
    _same_batch(run.batches[0], sync.batches[0])  # step 1: version 0 in both
    _same_batch(run.batches[1], probe.batches[0])  # step 2: sampled by version 0, during step 1's update
    # the synchronous run sampled step 2 after the update: other logprobs than the stale batch
    assert [lp for t in sync.batches[1] for _, lps in t for lp in lps] != pytest.approx(
        [lp for t in run.batches[1] for _, lps in t for lp in lps], abs=1e-5)
    # the bound, counted: every row that reached the update is labelled, none older than 1 version
    assert None not in run.ages and max(run.ages) == 1 and run.ages.count(0) > 0
    assert [h["async/stale_dropped"] for h in hist] == [0.0, 0.0, 0.0]
    assert [h["async/staleness_max"] for h in hist] == [0.0, 1.0, 1.0]
    assert [h["data/position"] for h in hist] == [2.0, 4.0, 6.0]
    assert [h["async/policy_version"] for h in hist] == [0.0, 1.0, 2.0]


def test_staleness_two_never_trains_older_rows(model, tmp_path):
    run, hist, _ = _fit(_cfg(model, tmp_path / "k2", "rollout.max_staleness=2", "trainer.steps=5",
                             "rollout.partial=abort"))
    assert None not in run.ages and max(run.ages) <= 2
    assert sum(h["async/stale_dropped"] for h in hist) == 0.0
    # batches 1-3 may all start on version 0 (step t waits for version t - 2): rows up to two versions old
    # train (how old exactly depends on how far the producer got during each update)
    assert max(h["async/staleness_max"] for h in hist) >= 1.0
    assert [h["data/position"] for h in hist] == [2.0, 4.0, 6.0, 8.0, 10.0]
