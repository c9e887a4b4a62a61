"""AEPO on the real tiny model: the entropies of the old-logprob pass are the policy's own (a direct
forward), and a training step with the gate on trains only the rows with a positive advantage and reward."""

from __future__ import annotations

import pytest
import torch

from memrl.config import load_config
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.ranks.workers import build_workers
from memrl.training.trainer import Trainer
from memrl.types import Segment

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def test_old_logprob_pass_gives_the_policys_entropy(tiny_path):
    cfg = load_config(TrainConfig, [f"model.path={tiny_path}", "algorithm.kl_coef=0", "trainer.token_budget=4096"])
    rows = [Segment([5, 6, 7, 8], [9, 10, 11], [-1.0] * 3), Segment([12, 13], [14, 15], [-1.0] * 2)]
    workers = build_workers(cfg)
    try:
        lps, ents = workers.old_logprobs_entropy(rows)
        assert lps == workers.old_logprobs(rows)
        for r, ent in zip(rows, ents, strict=True):
            ids = torch.tensor([r.prompt_ids + r.response_ids])
            with torch.no_grad():
                logp = torch.log_softmax(workers.model(input_ids=ids).logits[0].float(), dim=-1)
            p = len(r.prompt_ids)
            want = [float(-(logp[t].exp() * logp[t]).sum()) for t in range(p - 1, p - 1 + len(r.response_ids))]
            assert ent == pytest.approx(want, abs=1e-5)
    finally:
        workers.close()


def _cfg(model: str, out, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", "trainer.steps=1", "workflow=memagent", "workflow.chunk_tokens=24",
        "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3", "data.synthetic.num_chunks=2",
        "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2", "algorithm.kl_coef=0",
        "trainer.progress=false", "trainer.tensorboard=false", "engine.name=hf", "trainer.save_every=0",
        "algorithm.old_logprobs=trainer", "algorithm.aepo.enabled=true", *extra])


def test_gate_on_and_off_in_a_training_step(tiny_path, tmp_path):
    # gate on (entropy > 0 always): a row trains only with A > 0 and reward > 0; the untrained tiny model's
    # rewards are 0 (or the advantage is 0), so every row is dropped and no optimizer step runs
    on = Trainer(assemble(_cfg(tiny_path, tmp_path / "on", "algorithm.aepo.entropy_low=0"))).fit()[0]
    assert on["aepo/active"] == 1.0 and on["aepo/entropy"] > 0
    rows = on["aepo/rows_kept"] + on["aepo/rows_dropped"]
    assert rows >= 2 * 2 * 2  # 2 tasks x 2 trajectories x (a memory call + the final call) at least
    assert on["aepo/rows_kept"] == 0 and "train/rows" not in on
    # gate off (entropy never below 1e-6): every row trains
    off = Trainer(assemble(_cfg(tiny_path, tmp_path / "off", "algorithm.aepo.entropy_high=0.000001"))).fit()[0]
    assert off["aepo/active"] == 0.0 and off["aepo/rows_dropped"] == 0
    assert off["train/rows"] == off["aepo/rows_kept"]
