"""Mixed precision (memrl.precision): where it is refused, what the engine holds, and that the trainer's
forward computes in bfloat16 over float32 master weights while the loss stays float32."""

from __future__ import annotations

import asyncio

import pytest
import torch

from memrl import precision as P
from memrl.config import ConfigError
from memrl.engines.base import SamplingParams
from memrl.engines.hf import HFEngine
from memrl.models.tiny import cached_tiny_model


def test_bfloat16_compute_is_refused_on_a_cpu_without_bfloat16_instructions(monkeypatch) -> None:
    monkeypatch.setattr(P, "cpu_has_bf16", lambda: False)
    with pytest.raises(ConfigError) as e:
        P.check_compute_dtype("bfloat16", "cpu", "model.compute_dtype")
    assert str(e.value) == ("model.compute_dtype=bfloat16 needs a CPU with bfloat16 instructions (avx512_bf16 or "
                            "AMX); this one has none, where bfloat16 is slower than float32: leave it unset (float32) or "
                            "say auto")
    P.check_compute_dtype(None, "cpu", "model.compute_dtype")  # float32 needs nothing
    P.check_compute_dtype("float32", "cpu", "model.compute_dtype")


def test_train_refuses_it_in_one_line_before_the_model_loads(monkeypatch, tmp_path) -> None:
    from memrl.config import load_config
    from memrl.training.config import TrainConfig

    monkeypatch.setattr(P, "cpu_has_bf16", lambda: False)
    cfg = load_config(TrainConfig, [f"model.path={tmp_path}", "model.compute_dtype=bfloat16"])
    with pytest.raises(ConfigError, match=r"^model\.compute_dtype=bfloat16 needs a CPU with bfloat16"):
        cfg.model.check()


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_follows_the_cpu_and_says_so(monkeypatch, caplog, tmp_path, has_bf16) -> None:
    """compute_dtype=auto: bfloat16 where the CPU has bfloat16 instructions, else float32 (the detection faked),
    one log line naming the choice; the train config holds the resolved dtype after its check."""
    import logging

    from memrl.config import load_config
    from memrl.training.config import TrainConfig

    monkeypatch.setattr(P, "cpu_has_bf16", lambda: has_bf16)
    chosen = "bfloat16" if has_bf16 else "float32"
    why = ("this CPU has bfloat16 instructions (avx512_bf16 or AMX)" if has_bf16 else "this CPU has no bfloat16 "
           "instructions (avx512_bf16 or AMX), where bfloat16 is slower than float32")
    with caplog.at_level(logging.INFO, logger="memrl.precision"):
        assert P.resolve_compute_dtype("auto", "cpu", "model.compute_dtype") == chosen
    assert [r.getMessage() for r in caplog.records] == [f"model.compute_dtype=auto: {chosen} ({why})"]
    assert P.resolve_compute_dtype(None, "cpu", "k") is None  # anything else passes through, checked
    assert P.resolve_compute_dtype("float32", "cpu", "k") == "float32"
    cfg = load_config(TrainConfig, [f"model.path={tmp_path}", "model.compute_dtype=auto"])
    cfg.model.check()
    assert cfg.model.compute_dtype == chosen


@pytest.mark.parametrize("has_bf16", [True, False])
def test_the_hf_engine_resolves_auto_for_its_own_weights(monkeypatch, has_bf16) -> None:
    monkeypatch.setattr(P, "cpu_has_bf16", lambda: has_bf16)
    eng = HFEngine(str(cached_tiny_model("tiny")), compute_dtype="auto", dtype="float32")
    want = torch.bfloat16 if has_bf16 else torch.float32
    assert eng.compute_dtype == want and next(eng.model.parameters()).dtype == want


def test_autocast_is_a_no_op_unless_the_compute_dtype_differs_from_the_weights() -> None:
    x, w = torch.ones(2, 4), torch.ones(4, 3)
    with P.autocast("cpu", None):
        assert (x @ w).dtype == torch.float32
    with P.autocast("cpu", torch.bfloat16, torch.bfloat16):
        assert (x @ w).dtype == torch.float32
    with P.autocast("cpu", torch.bfloat16, torch.float32):
        assert (x @ w).dtype == torch.bfloat16


@pytest.mark.skipif(not P.cpu_has_bf16(), reason="this CPU has no bfloat16 instructions")
def test_engine_with_weights_of_its_own_holds_them_in_bfloat16_and_returns_float32_logprobs() -> None:
    path = cached_tiny_model("tiny")
    eng = HFEngine(path, compute_dtype="bfloat16", dtype="float32")
    try:
        assert {p.dtype for p in eng.model.parameters()} == {torch.bfloat16}
        out = asyncio.run(eng.generate([5, 6, 7, 8], SamplingParams(max_tokens=4, temperature=0.0)))
        assert len(out.token_ids) == len(out.logprobs) and all(isinstance(x, float) for x in out.logprobs)
        # weight sync casts the float32 policy's tensors into the bfloat16 copy
        sd = {k: v.float() * 0 for k, v in eng.model.state_dict().items()}
        eng.update_weights(sd)
        assert all(float(p.detach().abs().sum()) == 0.0 and p.dtype == torch.bfloat16 for p in eng.model.parameters())
    finally:
        asyncio.run(eng.close())


@pytest.mark.skipif(not P.cpu_has_bf16(), reason="this CPU has no bfloat16 instructions")
def test_worker_keeps_float32_master_weights_and_adam_state_under_bfloat16_compute() -> None:
    from memrl.config import load_config
    from memrl.training.config import TrainConfig
    from memrl.training.ranks.workers import PolicyWorker
    from memrl.training.update.packing import weigh
    from memrl.types import Segment

    path = cached_tiny_model("tiny")
    cfg = load_config(TrainConfig, [f"model.path={path}", "model.compute_dtype=bfloat16", "optim.warmup_steps=0"])
    w = PolicyWorker(cfg)
    segs = [Segment([5, 6, 7], [8, 9], [-8.0, -8.0], loss_mask=[1, 1], advantage=1.0, trajectory_id="t0")]
    rows = weigh(segs, "token-mean")
    seen: list[torch.dtype] = []
    hook = w.model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    before = {k: v.clone() for k, v in w.model.state_dict().items()}
    out = w.train_rows(rows)
    hook.remove()
    assert seen == [torch.bfloat16]  # the forward computed in bfloat16
    assert {p.dtype for p in w.model.parameters()} == {torch.float32}
    assert {t.dtype for st in w.opt.state.values() for t in st.values() if t.dim() > 0} == {torch.float32}
    assert any(not torch.equal(before[k], v) for k, v in w.model.state_dict().items())  # the update happened
    assert torch.isfinite(torch.tensor(out["loss/total"]))
    lp = w.old_logprobs(segs)
    assert len(lp[0]) == 2 and all(x < 0 for x in lp[0])
