"""algorithm.off_policy end to end on the tiny model (CPU, the in-process transformers engine sharing the
trained module): every mode logs mismatch/hf/* each step, ~0 here (the engine and the trainer run the same
module; not exactly 0 because the engine decodes with a KV cache and batches differently); with the engine
that close to the trainer, tis and decoupled train the same weights as each other and nearly the loss of
none (docs/guides/async.md)."""

from __future__ import annotations

import json

import pytest
import torch
from doubles import register_parity_workflow

from memrl.config import load_config
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

pytestmark = pytest.mark.slow


register_parity_workflow("memagent_offpolicy")


def _run(model: str, out, mode: str) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    cfg = load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", "trainer.steps=2", "workflow=memagent_offpolicy",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=3",
        "algorithm.kl_coef=0.01", "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.save_every=0",
        "trainer.token_budget=600", "trainer.progress=false", f"trainer.tensorboard={mode == 'none'}", "engine.name=hf",
        f"algorithm.off_policy={mode}",
    ])
    t = Trainer(assemble(cfg))
    hist = t.fit()
    weights = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
    t.close()
    return hist, weights


def test_every_mode_logs_mismatch_and_trains(tmp_path):
    from memrl.models.tiny import cached_tiny_model

    model = str(cached_tiny_model("tiny"))
    runs = {mode: _run(model, tmp_path / mode, mode) for mode in ("none", "tis", "decoupled")}
    for mode, (hist, _) in runs.items():
        assert len(hist) == 2
        for h in hist:
            assert h["mismatch/hf/tokens"] > 0, mode
            assert 0 <= h["mismatch/hf/abs_logprob_diff_mean"] < 1e-5, (mode, h)
            assert 0 <= h["mismatch/hf/kl_k3"] < 1e-10, (mode, h)
            assert h["mismatch/hf/ratio_outside_share"] == 0.0, (mode, h)
        lines = [json.loads(x) for x in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
        assert [x["mismatch/hf/abs_logprob_diff_mean"] for x in lines] == [h["mismatch/hf/abs_logprob_diff_mean"]
                                                                           for h in hist]
        assert ("loss/is_weight" in hist[0]) == (mode != "none")
    # TensorBoard gets the same scalars
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "none" / "tb"))
    acc.Reload()
    tb = [e.value for e in acc.Scalars("mismatch/hf/abs_logprob_diff_mean")]
    assert tb == pytest.approx([h["mismatch/hf/abs_logprob_diff_mean"] for h in runs["none"][0]], rel=1e-6)
    # the viewer's metric picker lists the new curves and draws them (memrl/viewer)
    from memrl.viewer.data import Run

    run = Run.open(tmp_path / "tis")
    assert {f"mismatch/hf/{k}" for k in ("abs_logprob_diff_mean", "kl_k3", "ratio_outside_share", "tokens")} <= set(
        run.summary()["metric_names"])
    curve = run.metrics(["mismatch/hf/kl_k3"])["mismatch/hf/kl_k3"]
    assert [p[0] for p in curve] == [1.0, 2.0] and [p[1] for p in curve] == [h["mismatch/hf/kl_k3"] for h in runs["tis"][0]]
    (none, w_none), (tis, w_tis), (dec, w_dec) = runs["none"], runs["tis"], runs["decoupled"]
    # the engine's logprobs are the trainer's to ~1e-7: every correction weight is ~1 (none is capped or dropped),
    # so tis and decoupled compute the same loss and weights, and none's loss to float rounding
    assert all(torch.equal(w_tis[k], w_dec[k]) for k in w_tis)
    assert [h["loss/total"] for h in tis] == [h["loss/total"] for h in dec]
    for a, b in zip(none, tis, strict=True):
        assert abs(a["loss/total"] - b["loss/total"]) < 1e-6
        assert abs(b["loss/is_weight"] - 1.0) < 1e-5
    assert max(float((w_none[k] - w_tis[k]).abs().max()) for k in w_none) < 1e-4
