"""LoRA (model.lora.*) end to end on the tiny model (CPU): only the adapter trains, checkpoints hold PEFT's
adapter (and on request a merged HuggingFace directory), resume is exact, every engine kind in process gets
the adapter (rollout.sync_check proves it after every sync), and the check fails when the sync is removed."""

from __future__ import annotations

import pytest
import torch
from doubles import register_parity_workflow

pytest.importorskip("peft")

from memrl.config import ConfigError, load_config  # noqa: E402
from memrl.quiet import peft_rename_warning_off  # noqa: E402
from memrl.training.assemble import assemble  # noqa: E402
from memrl.training.config import TrainConfig  # noqa: E402
from memrl.training.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.slow


register_parity_workflow("memagent_parity_lora")


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _cfg(model: str, out, steps: int, *extra: str) -> TrainConfig:
    ov = [
        f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memagent_parity_lora",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=4", "workflow.max_final_tokens=2",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2",
        "algorithm.kl_coef=0", "optim.lr=5e-3", "optim.warmup_steps=0", "trainer.save_every=1",
        "trainer.keep_checkpoints=0", "trainer.token_budget=4096", "trainer.progress=false",
        "trainer.tensorboard=false", "engine.name=hf", "model.lora.rank=4", "model.lora.alpha=8",
        "rollout.sync_check=true",
    ] + list(extra)
    return load_config(TrainConfig, ov)


def _lora_weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def test_only_the_adapter_trains_and_checkpoints_hold_peft_files(tiny_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_path).state_dict()
    trainer = Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 2, "model.lora.save_merged=true")))
    history = trainer.fit()
    assert len(history) == 2
    # the check ran after both syncs (and before the first rollout) and passed
    assert all(h["sync/probe_max_abs_diff"] <= 1e-3 and h["time/sync_check_s"] > 0 for h in history)
    m = trainer.model
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # the base weights are untouched; the adapter moved
    for k, v in m.get_base_model().state_dict().items():
        if "lora_" not in k:
            assert torch.equal(v, base[k.replace(".base_layer.", ".")]), k
    assert any(torch.count_nonzero(v) for k, v in _lora_weights(m).items() if "lora_B" in k)
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt", "merged"} <= names
    assert "model.safetensors" not in names
    # PEFT loads the adapter onto the base; the merged directory loads with transformers alone; both equal
    # the trained policy's outputs
    ids = torch.tensor([[3, 5, 7, 11, 13, 17]])
    with torch.no_grad():
        want = m(input_ids=ids).logits
        with peft_rename_warning_off():  # peft reads transformers' renamed property
            peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_path), ckpt).eval()
        merged = AutoModelForCausalLM.from_pretrained(ckpt / "merged").eval()
        assert torch.allclose(peft_model(input_ids=ids).logits, want, atol=1e-5)
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)


def test_resume_is_exact(tiny_path, tmp_path):
    straight = Trainer(assemble(_cfg(tiny_path, tmp_path / "a", 3)))
    hist_a = straight.fit()
    first = Trainer(assemble(_cfg(tiny_path, tmp_path / "b", 1)))
    first.fit()
    resumed = Trainer(assemble(_cfg(tiny_path, tmp_path / "b", 3), resume=True))
    hist_b = resumed.fit()
    assert resumed.step == 3 and [round(h["reward/mean"], 9) for h in hist_b] == [
        round(h["reward/mean"], 9) for h in hist_a[1:]]
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("share", ["true", "false"])
def test_sync_check_passes_after_every_sync(tiny_path, tmp_path, share):
    trainer = Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 2, f"engine.hf.share_weights={share}",
                           "trainer.save_every=0")))
    history = trainer.fit()
    assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
    if share == "false":  # the engine holds a plain merged copy (no PEFT) and got merged weights
        assert trainer.parts.engine.model is not trainer.model and not hasattr(trainer.parts.engine.model, "peft_config")
        assert trainer.parts.engine.stats.weight_updates == 3  # before the first rollout + after each step


def test_sync_check_fails_when_the_sync_is_removed(tiny_path, tmp_path, monkeypatch):
    from memrl.engines.hf import HFEngine
    from memrl.training.sync.sync_check import SyncCheckError

    monkeypatch.setattr(HFEngine, "update_weights", lambda self, weights: None)
    trainer = Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 3, "engine.hf.share_weights=false")))
    with pytest.raises(SyncCheckError) as e:
        trainer.fit()
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("rollout.sync_check failed after the update of step 1: engine hf (in process, "
                          "engine.hf.share_weights=false) gives logprob ")
    assert "the engine is not serving the trained weights" in msg


@pytest.mark.parametrize("synced", [True, False])
def test_openai_server_reloads_the_merged_directory(tiny_path, tmp_path, monkeypatch, synced):
    """engine=openai: after each update the trainer writes the merged HuggingFace directory (no PEFT on the
    server side) to engine.openai.sync_dir and the server reloads it; the probe proves the server serves it,
    and stops the run naming the server when the reload is dropped."""
    from doubles import CompletionServer
    from transformers import AutoModelForCausalLM

    from memrl.engines.hf import HFEngine
    from memrl.training.sync.sync_check import SyncCheckError

    sync_dir = tmp_path / "sync"
    with CompletionServer(HFEngine(tiny_path, device="cpu", dtype="float32", seed=0, deterministic=False)) as srv:
        if not synced:  # the server takes the reload request and keeps its old weights
            monkeypatch.setattr(srv.engine, "update_weights", lambda weights: None)
        cfg = _cfg(tiny_path, tmp_path / "run", 2, "engine=openai", f"engine.openai.base_url={srv.url}",
                   f"engine.model={tiny_path}", f"engine.openai.sync_dir={sync_dir}", "trainer.save_every=0")
        trainer = Trainer(assemble(cfg))
        if not synced:
            with pytest.raises(SyncCheckError) as e:
                trainer.fit()
            assert str(e.value).startswith(f"rollout.sync_check failed after the update of step 1: engine openai "
                                           f"({srv.url}) gives logprob ")
            return
        history = trainer.fit()
        assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
        assert [ev[1] for ev in srv.events if ev[0] == "load"] == [str(sync_dir.resolve())] * 3
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in sync_dir.iterdir()}
    assert not any("lora" in p.name for p in sync_dir.iterdir())
    plain = AutoModelForCausalLM.from_pretrained(sync_dir).eval()
    ids = torch.tensor([[2, 4, 6, 8]])
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)


def test_bad_target_modules_is_one_line(tiny_path, tmp_path):
    with pytest.raises(ConfigError) as e:
        assemble(_cfg(tiny_path, tmp_path / "run", 1, "model.lora.target_modules=[nope_proj]"))
    assert str(e.value).startswith("model.lora.target_modules=['nope_proj']: ")
    assert "\n" not in str(e.value)


def test_train_sft_with_lora_writes_the_adapter_and_the_merged_model(tiny_path, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from memrl.cli import main

    out = tmp_path / "sft"
    rc = main(["train-sft", f"model.path={tiny_path}", f"out_dir={out}", "model.lora.rank=4",
               "model.lora.save_merged=true", "demonstrator.num_tasks=6", "sft.batch_rows=8", "sft.lr=1e-2",
               "sft.warmup_steps=0", "workflow.chunk_tokens=24", "workflow.max_memory_tokens=12",
               "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8"])
    assert rc == 0
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "merged", "metrics.jsonl"} <= names
    assert "model.safetensors" not in names
    adapter = load_file(str(out / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
    assert any(torch.count_nonzero(v) for k, v in adapter.items() if "lora_B" in k)  # it trained
    ids = torch.tensor([[3, 5, 7, 11]])
    with torch.no_grad():
        with peft_rename_warning_off():  # peft reads transformers' renamed property
            peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_path), out).eval()
        merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
        base = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
        want = peft_model(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)
        assert not torch.allclose(base(input_ids=ids).logits, want, atol=1e-4)


def test_kl_reference_is_the_base_with_adapters_off(tiny_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from memrl.training.update.lora import BaseReference
    from memrl.training.update.packing import collate
    from memrl.training.update.policy import token_logprobs
    from memrl.types import Segment

    trainer = Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 1, "algorithm.kl_coef=0.05", "trainer.save_every=0")))
    history = trainer.fit()
    ref = trainer.parts.workers.handles[0].worker.ref
    assert isinstance(ref, BaseReference) and "loss/kl" in history[0]
    rows = [Segment(prompt_ids=[3, 5, 7], response_ids=[11, 13, 17, 19], response_logprobs=[0.0] * 4,
                    advantage=1.0, trajectory_id="t")]
    mb = collate(rows)
    base = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    with torch.no_grad():
        want, _ = token_logprobs(base, mb)
        got, _ = token_logprobs(ref, mb)
        moved, _ = token_logprobs(trainer.model, mb)
    assert torch.equal(got, want)  # bit-identical to a separately loaded reference
    assert not torch.equal(moved, want)  # while the policy itself moved
