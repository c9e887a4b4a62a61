"""One CUDA device, no Ray, no vLLM: the single-process trainer, the policy update and the transformers
engine on the GPU give what they give on the CPU. Marked gpu: skipped without CUDA.

Tolerances: float32 on both devices; CUDA's matmuls and reductions run in another order than the CPU's
(TF32 is off), so one update agrees to 1e-5 in loss and 1e-4 relative in gradient norm, not bitwise; the
weights after AdamW's first step (each moves by about lr = 1e-3, lr * g / (|g| + eps)) agree to 5e-5
(measured on an H200: 1.9e-5, from parameters whose gradients are near eps). Resume on the same device is
compared to 1e-6 (measured on an H200: bitwise equal).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
import torch

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.update.packing import TrainBatch, weigh
from memrl.types import Segment

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

GOLDEN = Path(__file__).parents[1] / "data" / "memagent_greedy_hf.json"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny", tmp_path_factory.getbasetemp() / "memrl-models"))


def _train_cfg(model: str, out, steps: int, device: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", f"model.device={device}",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=3",
        "algorithm.kl_coef=0.01", "optim.lr=1e-3", "trainer.save_every=2", "trainer.progress=false",
        "trainer.tensorboard=false", "engine.name=hf", "engine.dtype=float32",
    ])


def _rows(vocab: int) -> TrainBatch:
    rng = random.Random(1)
    rows = []
    for i in range(9):
        p, n = rng.randint(3, 20), rng.randint(1, 12)
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-rng.uniform(0.5, 9.0) for _ in range(n)], advantage=rng.uniform(-1, 1),
                            trajectory_id=f"t{i % 4}"))
    return weigh(rows, "token-mean")  # loss_agg's default


def _maxdiff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def test_one_update_on_cuda_equals_cpu(tiny_path):
    from transformers import AutoConfig

    from memrl.training.ranks.workers import PolicyWorker

    torch.backends.cuda.matmul.allow_tf32 = False
    vocab = AutoConfig.from_pretrained(tiny_path).vocab_size
    out = {}
    for dev in ("cpu", "cuda"):
        cfg = load_config(TrainConfig, [f"model.path={tiny_path}", f"model.device={dev}", "algorithm.kl_coef=0.05",
                                        "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=60"])
        w = PolicyWorker(cfg)
        m = w.train_rows(_rows(vocab))
        out[dev] = (m, w.full_state())
        w.close()
    (mc, wc), (mg, wg) = out["cpu"], out["cuda"]
    assert abs(mc["loss/total"] - mg["loss/total"]) < 1e-5
    assert abs(mc["train/grad_norm"] - mg["train/grad_norm"]) < 1e-4 * mc["train/grad_norm"]
    d = _maxdiff(wc, wg)
    print(f"cpu vs cuda after one update: loss {mc['loss/total']:.6f} vs {mg['loss/total']:.6f}, weights {d:.2e}")
    assert d < 5e-5


def test_trainer_on_cuda_trains_saves_and_resumes(tiny_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    straight = Trainer(assemble(_train_cfg(tiny_path, tmp_path / "a", 4, "cuda")))
    hist_a = straight.fit()
    assert len(hist_a) == 4 and next(straight.model.parameters()).device.type == "cuda"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "checkpoints" / "step_000004")
    assert _maxdiff(loaded.state_dict(), straight.model.state_dict()) == 0.0
    Trainer(assemble(_train_cfg(tiny_path, tmp_path / "b", 2, "cuda"))).fit()
    resumed = Trainer(assemble(_train_cfg(tiny_path, tmp_path / "b", 4, "cuda"), resume=True))
    hist_b = resumed.fit()
    assert resumed.state.position == straight.state.position
    d = _maxdiff(straight.model.state_dict(), resumed.model.state_dict())
    print(f"cuda resume: max weight difference {d:.2e}; rewards {[h['reward/mean'] for h in hist_a[2:]]} "
          f"vs {[h['reward/mean'] for h in hist_b]}")
    assert d < 1e-6
    assert [h["reward/mean"] for h in hist_a[2:]] == [h["reward/mean"] for h in hist_b]


def test_greedy_memagent_on_cuda_matches_the_cpu_golden(tiny_path):
    """The recorded CPU greedy trajectories (tests/data/memagent_greedy_hf.json), served from CUDA in fp32."""
    from memrl.engines import EngineConfig, build_engine
    from memrl.runtime import rollout_once
    from memrl.types import Task
    from memrl.workflows import get_workflow

    golden = json.loads(GOLDEN.read_text())
    tasks = [Task(t["task_id"], t["question"], t["context"], ["Kalomi"]) for t in golden["tasks"]]
    spec = get_workflow("memagent")
    cfg = spec.config_cls(chunk_tokens=64, max_memory_tokens=12, max_final_tokens=8, temperature=0.0)
    eng = build_engine(load_config(EngineConfig, [f"model={tiny_path}", "max_batch_size=16", "hf.device=cuda",
                                                  "dtype=float32"]))
    groups = rollout_once(tasks, spec, eng, cfg, n=1, concurrency=6, seed=0)
    asyncio.run(eng.close())
    got = {g.task_id: [s.response_ids for s in g.trajectories[0].segments] for g in groups}
    same = sum(got[k] == v for k, v in golden["responses"].items())
    print(f"greedy on cuda: {same}/{len(golden['responses'])} tasks token-identical to the CPU golden")
    assert got == golden["responses"]
