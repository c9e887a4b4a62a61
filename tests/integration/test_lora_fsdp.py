"""LoRA (model.lora.*) under FSDP2 ranks (trainer.num_workers > 1, gloo on the CPU), on the tiny model.

(a) One spawn of 2 processes: an update of the adapter on 2 ranks equals world size 1 on the same batch
(loss, grad norm, adapter; the base stays bit-identical, only adapter tensors are in the optimizer); the
2-rank checkpoint holds PEFT's files under the names world size 1 writes (PEFT loads them onto the base)
and the merged directory (transformers loads it); 2 -> 2 resume is exact (1 + 1 steps equal 2 steps bit
for bit); the ranks score the sync check's probe as world size 1 does.
(b) Ray: 2 ranks + one transformers replica train with rollout.sync_check on, the replica getting the
merged weights through each weight-sync mode (object_store, directory, broadcast); the check stops the run
naming the engine when the sync is removed; a 2-rank run resumes with the saved adapter and optimizer state
bit-identical.

Tolerances (float32, CPU): as tests/integration/test_fsdp_parity.py, loss 1e-6 and grad norm 3e-5 relative
(the ranks sum their shares' gradients in another order than one process: rounding only; measured: loss
1.7e-8 and 1.9e-9, grad norm 0 and 7.7e-8 relative); adapter 1e-5 absolute after AdamW at lr 1e-3
(measured 1.8e-7 after one step, 2.0e-6 after two). Probe logprobs 2e-6 (one forward, sharded vs not;
measured 0). trainer.fsdp_bf16: loss 5e-4 of the float32 loss (bfloat16 keeps 8 mantissa bits; measured
5.1e-5), grad norm 1% (measured 0.14%); its adapter is not compared (AdamW's first step is about
lr * sign(gradient), and bf16 flips the sign of near-zero entries: measured 2e-3 = 2 lr).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from doubles import local_ray, register_parity_workflow
from test_fsdp_parity import _rows, _same_optim

pytest.importorskip("peft")

from memrl.config import load_config  # noqa: E402
from memrl.training.config import TrainConfig  # noqa: E402
from memrl.training.ranks import distributed as D  # noqa: E402

pytestmark = pytest.mark.slow

LOSS_TOL, GN_RTOL, W_TOL, PROBE_TOL, BF16_LOSS_TOL = 1e-6, 3e-5, 1e-5, 2e-6, 5e-4
PROMPT, TOKENS = [3, 5, 7, 11, 13], [17, 19, 23]

register_parity_workflow("memagent_parity_lora_fsdp")


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


_WORKER = ["algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01", "optim.lr=1e-3", "optim.warmup_steps=0",
           "trainer.token_budget=60", "trainer.progress=false", "model.lora.rank=4", "model.lora.alpha=8",
           "model.lora.save_merged=true"]


def _worker_cfg(model: str, out: str) -> TrainConfig:
    return load_config(TrainConfig, [f"model.path={model}", f"out_dir={out}", *_WORKER])


def _rank_main(rank: int, model: str, tmp: str, port: int, vocab: int) -> None:
    torch.set_num_threads(1)
    from memrl.training.ranks.workers import PolicyWorker

    info = D.DistInfo(rank, 2, "127.0.0.1", port)
    cfg = _worker_cfg(model, tmp)
    out: dict[str, object] = {}
    w = PolicyWorker(cfg, info)
    out["trainable"] = sorted(n for n, p in w.model.named_parameters() if p.requires_grad)
    out["probe0"] = w.probe_logprobs(PROMPT, TOKENS)
    out["m1"] = w.train_rows(_rows(1, vocab, rank))
    out["w1"] = w.full_state()
    out["o1"] = w.optim_state()
    out["probe1"] = w.probe_logprobs(PROMPT, TOKENS)
    w.save(os.path.join(tmp, "ck2"), 1, {"step": 1, "data_position": 0})
    out["m2"] = w.train_rows(_rows(2, vocab, rank))
    out["w2"] = w.full_state()
    w22 = PolicyWorker(cfg, info, start=os.path.join(tmp, "ck2", "step_000001"))  # 2 -> 2, the same group
    out["w22_start"], out["o22_start"] = w22.full_state(), w22.optim_state()
    out["m22"] = w22.train_rows(_rows(2, vocab, rank))
    out["w22"] = w22.full_state()
    # FSDP2 mixed precision (bf16 compute, fp32 gradient reduction), the KL reference's forward first
    wb = PolicyWorker(load_config(TrainConfig, [*_WORKER, f"model.path={model}", f"out_dir={tmp}",
                                                "trainer.fsdp_bf16=true"]), info)
    out["mb1"] = wb.train_rows(_rows(1, vocab, rank))
    out["wb1"] = wb.full_state()
    if rank == 0:
        torch.save(out, os.path.join(tmp, "rank0.pt"))
    w.close()


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _lora(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if ".lora_" in k}


def test_two_ranks_train_the_adapter_as_one_and_checkpoint_it(tiny_path, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from memrl.quiet import peft_rename_warning_off
    from memrl.training.ranks.workers import PolicyWorker
    from memrl.training.update.lora import merge_state_dict

    vocab = AutoConfig.from_pretrained(tiny_path).vocab_size
    cfg = _worker_cfg(tiny_path, str(tmp_path))
    w = PolicyWorker(cfg)
    base = w.full_state()
    probe0 = w.probe_logprobs(PROMPT, TOKENS)
    m1 = w.train_rows(_rows(1, vocab))
    w1 = w.full_state()
    probe1 = w.probe_logprobs(PROMPT, TOKENS)
    ck1 = w.save(str(tmp_path / "ck1"), 1, {"step": 1, "data_position": 0})
    m2 = w.train_rows(_rows(2, vocab))
    w2 = w.full_state()

    mp.spawn(_rank_main, args=(tiny_path, str(tmp_path), D.free_port(), vocab), nprocs=2, join=True)
    got = torch.load(tmp_path / "rank0.pt", weights_only=True)

    # only the adapter trains on the ranks, and only it is in the optimizer
    assert got["trainable"] and all(".lora_" in n for n in got["trainable"])
    assert sorted(got["o1"]["state"]) == got["trainable"]
    # the same seeded adapter init on every rank: before any update the ranks score as world size 1
    assert max(abs(a - b) for a, b in zip(probe0, got["probe0"], strict=True)) < PROBE_TOL
    assert max(abs(a - b) for a, b in zip(probe1, got["probe1"], strict=True)) < PROBE_TOL
    # 2 ranks = world size 1: loss, KL to the adapters-off reference, grad norm, the adapter
    for ref, mine in ((m1, got["m1"]), (m2, got["m2"])):
        assert abs(ref["loss/total"] - mine["loss/total"]) < LOSS_TOL
        assert abs(ref["loss/kl"] - mine["loss/kl"]) < LOSS_TOL
        assert abs(ref["train/grad_norm"] - mine["train/grad_norm"]) <= GN_RTOL * ref["train/grad_norm"]
        assert (mine["train/rows"], mine["train/tokens"]) == (ref["train/rows"], ref["train/tokens"])
    assert _max_diff(_lora(base), _lora(w1)) > 1e-4  # the step moved the adapter
    assert _max_diff(_lora(w1), _lora(got["w1"])) < W_TOL
    assert _max_diff(_lora(w2), _lora(got["w2"])) < W_TOL
    for k, v in base.items():  # the base weights are untouched everywhere
        if ".lora_" not in k:
            assert torch.equal(got["w2"][k], v) and torch.equal(w2[k], v) and torch.equal(got["wb1"][k], v), k
    # bf16 compute: the loss within bf16 rounding of float32 world size 1 (measured 5.1e-5), the adapter moved
    assert abs(got["mb1"]["loss/total"] - m1["loss/total"]) < BF16_LOSS_TOL
    assert abs(got["mb1"]["train/grad_norm"] - m1["train/grad_norm"]) < 0.01 * m1["train/grad_norm"]
    assert _max_diff(_lora(base), _lora(got["wb1"])) > 1e-4

    # the 2-rank checkpoint: PEFT's files, the full adapter under world size 1's names, the merged model
    ck2 = tmp_path / "ck2" / "step_000001"
    names = {p.name for p in ck2.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "merged", "optimizer", "trainer_state.pt"} <= names
    assert "model.safetensors" not in names
    assert sorted(os.listdir(ck2 / "optimizer")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    a1, a2 = load_file(os.path.join(ck1, "adapter_model.safetensors")), load_file(str(ck2 / "adapter_model.safetensors"))
    assert a1.keys() == a2.keys() and all(a1[k].shape == a2[k].shape for k in a1)
    want = {k.replace(".default.", "."): v for k, v in _lora(got["w1"]).items()}
    assert a2.keys() == want.keys() and all(torch.equal(a2[k], want[k]) for k in want)
    ids = torch.tensor([PROMPT + TOKENS])
    with torch.no_grad(), peft_rename_warning_off():
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_path), ck2).eval()
        merged = AutoModelForCausalLM.from_pretrained(ck2 / "merged").eval()
        plain = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
        plain.load_state_dict(merge_state_dict(got["w1"], 8 / 4))
        assert torch.allclose(peft_model(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)
        assert torch.allclose(merged(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)
    for k, v in load_file(str(ck2 / "merged" / "model.safetensors")).items():
        assert torch.equal(v, plain.state_dict()[k]), k

    # 2 -> 2 resume: the saved adapter and optimizer come back bit-identical, and 1 + 1 steps equal 2 steps
    assert _max_diff(got["w22_start"], got["w1"]) == 0.0
    _same_optim(got["o22_start"], got["o1"])
    assert got["m22"] == got["m2"]
    assert _max_diff(got["w22"], got["w2"]) == 0.0


# ---------------------------------------------------------------------------------------------- Ray
@pytest.fixture(scope="module")
def ray_session(tmp_path_factory):
    pytest.importorskip("ray")
    with local_ray(2, tmp_path_factory.mktemp("r")):
        yield


def _cfg(model: str, out, steps: int, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memagent_parity_lora_fsdp",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=4", "workflow.max_final_tokens=2",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2",
        "algorithm.kl_coef=0", "optim.lr=5e-3", "optim.warmup_steps=0", "trainer.save_every=0",
        "trainer.token_budget=4096", "trainer.progress=false", "trainer.tensorboard=false",
        "model.lora.rank=4", "model.lora.alpha=8", "rollout.sync_check=true", "trainer.num_workers=2",
        "trainer.cpus_per_worker=0.5", "rollout.num_engines=1", "rollout.cpus_per_engine=0.5", *extra,
    ])


@pytest.mark.parametrize("mode", ["object_store", "directory", "broadcast"])
def test_ranks_sync_merged_weights_to_a_replica_and_the_check_passes(ray_session, tiny_path, tmp_path, mode):
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer
    from memrl.training.update.lora import merge_state_dict

    seen: list[int] = []

    def on_step(step: int, metrics: dict[str, float]) -> None:
        """The replica serves exactly the merged weights of the ranks' gathered state (HF names)."""
        want = {k: float(v.double().sum()) for k, v in merge_state_dict(t.parts.workers.full_state(), 8 / 4).items()}
        (served,) = t.parts.engine.param_sums()
        assert {k: served[k] for k in want} == want
        seen.append(step)

    t = Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 2, f"rollout.weight_sync={mode}")), on_step=on_step)
    history = t.fit()
    assert t.parts.sync.transfer.mode == mode and seen == [1, 2]
    assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
    assert all(h["time/sync_check_s"] > 0 for h in history)


def test_sync_check_with_ranks_fails_when_the_sync_is_removed(ray_session, tiny_path, tmp_path, monkeypatch):
    from memrl.engines.ray_engines import RayEngines
    from memrl.training.assemble import assemble
    from memrl.training.sync.sync_check import SyncCheckError
    from memrl.training.trainer import Trainer

    monkeypatch.setattr(RayEngines, "update_weights", lambda self, weights: None)
    t = Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 3, "rollout.weight_sync=object_store")))
    with pytest.raises(SyncCheckError) as e:
        t.fit()
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("rollout.sync_check failed after the update of step 1: engine hf "
                          "(rollout.num_engines=1 Ray replicas) gives logprob ")
    assert msg.endswith("the engine is not serving the trained weights")




def test_ranks_resume_from_the_adapter_checkpoint(ray_session, tiny_path, tmp_path):
    """A 2-rank LoRA run resumes on 2 ranks with the saved adapter and optimizer state bit-identical (the
    base from model.path, the adapter from the checkpoint) and trains on.
    Whole runs are not compared bit for bit: the Ray replica's waves depend on when requests arrive, so its
    sampling logprobs differ between two identical runs by float rounding (full tuning alike, docs/guides/lora.md);
    the 2-rank update itself resumes exactly (test_two_ranks_train_the_adapter_as_one_and_checkpoint_it)."""
    from safetensors.torch import load_file

    from memrl.training.assemble import assemble
    from memrl.training.checkpoints.checkpoint import read_optimizer
    from memrl.training.trainer import Trainer

    Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 1, "trainer.save_every=1"))).fit()
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    resumed = Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 2, "trainer.save_every=1"), resume=True))
    assert resumed.step == 1
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    got = {k.replace(".default.", "."): v for k, v in _lora(resumed.parts.workers.full_state()).items()}
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    _same_optim(resumed.parts.workers.optim_state(), read_optimizer(ckpt))
    more = resumed.fit()
    assert len(more) == 1 and more[0]["sync/probe_max_abs_diff"] <= 1e-3
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_000002"
