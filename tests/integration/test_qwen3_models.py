"""The tiny Qwen3 and Qwen3-MoE presets in training: one MemAgent RL step with each tiny preset (hf engine),
the router's load-balancing loss (trainer.router_aux_loss_coef) by hand, and the MoE model under FSDP2 on
2 gloo ranks giving the 1-process update."""

from __future__ import annotations

import random

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

from memrl.config import load_config
from memrl.errors import UserError
from memrl.models.tiny import cached_tiny_model
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.ranks import distributed as D
from memrl.training.ranks.workers import PolicyWorker
from memrl.training.trainer import Trainer
from memrl.training.update.packing import TrainBatch, collate, split, weigh
from memrl.training.update.policy import ppo_micro_loss
from memrl.types import Segment

pytestmark = pytest.mark.slow

# float32 on CPU, as tests/integration/test_fsdp_parity.py: loss 1e-6, grad norm 3e-5 relative
LOSS_TOL, GN_RTOL = 1e-6, 3e-5


def _rl_cfg(model: str, out, **extra: str) -> TrainConfig:
    ov = [
        f"model.path={model}", f"out_dir={out}", "trainer.steps=1", "workflow=memagent",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2",
        "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=600", "trainer.progress=false",
        "trainer.loggers=[jsonl]", "trainer.val_every=0", "engine.name=hf",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(TrainConfig, ov)


@pytest.mark.parametrize("preset, extra", [
    ("tiny", {}),
    ("tiny-qwen3", {"workflow.enable_thinking": "false", "workflow.memory_text": "strip_think"}),
    ("tiny-qwen3-moe", {"trainer.router_aux_loss_coef": "0.01"}),
])
def test_one_memagent_rl_step_per_tiny_preset(preset, extra, tmp_path):
    path = str(cached_tiny_model(preset))
    before = AutoModelForCausalLM.from_pretrained(path).state_dict()
    trainer = Trainer(assemble(_rl_cfg(path, tmp_path / "run", **extra)))
    (step,) = trainer.fit()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the RL step changed no weight"
    # 2 tasks x 2 samples x (1 memory call + the final call): each synthetic document (2 pieces of 8 words)
    # is under 24 tokens for the tiny tokenizer, which every preset shares
    assert step["train/rows"] == 2 * 2 * 2 and step["traj/num_chunks"] == 1.0
    if preset == "tiny-qwen3-moe":
        assert step["loss/router_aux"] > 0
        routers = [k for k in before if k.endswith("mlp.gate.weight")]
        assert len(routers) == 4 and all(not torch.equal(before[k], after[k]) for k in routers)
    else:
        assert "loss/router_aux" not in step


def test_router_aux_loss_is_added_by_the_micro_batch_weight():
    """loss(coef) - loss(0) = coef * sum(w) * aux, aux = the forward's own load-balancing loss (transformers'
    Qwen3-MoE with output_router_logits=True)."""
    path = str(cached_tiny_model("tiny-qwen3-moe"))
    model = AutoModelForCausalLM.from_pretrained(path)
    rows = _rows(model.config.vocab_size)
    mb = collate(rows.segments, rows.weights, 0)
    base = ppo_micro_loss(model, mb, 1.0)
    with_aux = ppo_micro_loss(model, mb, 1.0, router_aux_coef=0.5)
    aux = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, output_router_logits=True).aux_loss
    wsum = float(mb.weights.sum())
    assert abs(wsum - 1.0) < 1e-6  # token-mean weights over the whole batch sum to 1
    assert with_aux.sums["router_aux"] == pytest.approx(float(aux) * wsum, rel=1e-6)
    assert float(with_aux.loss - base.loss) == pytest.approx(0.5 * float(aux) * wsum, rel=1e-5)
    # the load-balancing loss of 8 experts, 2 per token, is near its balanced value, top_k = 2 (about 2 here)
    assert 1.5 < float(aux) < 3.0


def test_router_aux_on_a_dense_model_is_one_line(tmp_path):
    cfg = load_config(TrainConfig, [f"model.path={cached_tiny_model('tiny')}", f"out_dir={tmp_path}",
                                    "trainer.router_aux_loss_coef=0.01", "trainer.progress=false"])
    with pytest.raises(UserError, match=r"trainer.router_aux_loss_coef=0.01 needs a mixture-of-experts model .* "
                                        r"is qwen2$"):
        PolicyWorker(cfg)


def _rows(vocab: int, rank: int | None = None) -> TrainBatch:
    """7 rows of uneven lengths over 3 trajectories, random tokens, old logprobs and advantages."""
    rng = random.Random(3)
    rows = []
    for i in range(7):
        p, n = rng.randint(3, 16), rng.randint(1, 10)
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-rng.uniform(0.5, 9.0) for _ in range(n)], advantage=rng.uniform(-1, 1),
                            trajectory_id=f"t{i % 3}"))
    batch = weigh(rows, "token-mean")
    return batch if rank is None else split(batch, 2)[rank]


def _fsdp_cfg(model: str, out: str) -> TrainConfig:
    return load_config(TrainConfig, [f"model.path={model}", f"out_dir={out}", "algorithm.kl_coef=0",
                                     "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=60",
                                     "trainer.progress=false"])


def _rank_main(rank: int, model: str, tmp: str, port: int, vocab: int) -> None:
    torch.set_num_threads(1)
    info = D.DistInfo(rank, 2, "127.0.0.1", port)
    D.init_group(info)
    w = PolicyWorker(_fsdp_cfg(model, tmp), info)
    metrics = w.train_rows(_rows(vocab, rank))
    state = w.full_state()
    if rank == 0:
        torch.save({"m": metrics, "w": state}, f"{tmp}/rank0.pt")
    w.close()


def test_moe_two_fsdp_ranks_equal_one(tmp_path):
    model = str(cached_tiny_model("tiny-qwen3-moe"))
    vocab = AutoConfig.from_pretrained(model).vocab_size
    one = PolicyWorker(_fsdp_cfg(model, str(tmp_path)))
    base = one.full_state()
    m1 = one.train_rows(_rows(vocab))
    w1 = one.full_state()
    mp.spawn(_rank_main, args=(model, str(tmp_path), D.free_port(), vocab), nprocs=2, join=True)
    got = torch.load(tmp_path / "rank0.pt", weights_only=True)
    assert got["w"].keys() == w1.keys()
    assert max(float((w1[k] - base[k]).abs().max()) for k in w1) > 1e-4  # the step moved the weights
    assert abs(m1["loss/total"] - got["m"]["loss/total"]) < LOSS_TOL
    assert abs(m1["train/grad_norm"] - got["m"]["train/grad_norm"]) <= GN_RTOL * m1["train/grad_norm"]
    # Weights: AdamW's first step is lr * g / (|g| + 1e-8), so an entry whose gradient is near 1e-8 moves by a
    # fraction of lr that float noise in g changes. Qwen3's k_norm leaves such k_proj entries: at world size 1,
    # cutting the same rows into other micro-batches (token_budget 60 vs 1000) already moved one by 2.8e-5
    # (gradient 1.0e-9 vs 6.9e-10); 2 ranks measured 4.8e-5 on the same entry. Bound: a tenth of lr.
    assert max(float((w1[k] - got["w"][k]).abs().max()) for k in w1) < 0.1 * 1e-3
