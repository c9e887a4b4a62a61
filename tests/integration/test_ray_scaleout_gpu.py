"""The Ray scale-out run on GPUs: 2 FSDP2 ranks over NCCL and 2 vLLM rollout engines (split: weights by
NCCL broadcast into the vLLM workers; colocated: vLLM sleeping during the update, weights by directory,
since NCCL cannot pair a rank with the engine on its own GPU). Marked gpu: skipped without 4 (split) /
2 CUDA devices or without vllm. Not run here: the development machine has no GPU and the lent one has
one GPU and no vLLM."""

from __future__ import annotations

import os

import pytest
import torch

from memrl.config import load_config
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _vllm() -> bool:
    from memrl.engines.vllm import vllm_available

    return vllm_available()


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory):
    if _gpus() < 2 or not _vllm():
        pytest.skip("needs 2+ CUDA devices and vllm")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(_temp_dir=str(tmp_path_factory.mktemp("ray")), include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(out, steps: int, *extra: str) -> TrainConfig:
    from memrl.models.tiny import cached_tiny_model

    return load_config(TrainConfig, [
        f"model.path={cached_tiny_model('tiny')}", f"out_dir={out}", f"trainer.steps={steps}",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6",
        "workflow.max_final_tokens=3", "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8",
        "trainer.batch_size=2", "algorithm.n=3", "optim.lr=1e-3", "trainer.save_every=2",
        "trainer.progress=false", "trainer.tensorboard=false", "trainer.num_workers=2",
        "trainer.gpus_per_worker=1", "rollout.num_engines=2", "rollout.engine=vllm", *extra,
    ])


@pytest.mark.parametrize("layout", ["split", "colocated"])
def test_nccl_ranks_and_vllm_engines_train_and_resume(ray_session, tmp_path, layout):
    from transformers import AutoModelForCausalLM

    extra = ["rollout.colocate=true"] if layout == "colocated" else ["rollout.gpus_per_engine=1"]
    if layout == "split" and _gpus() < 4:
        pytest.skip("split layout needs 4 CUDA devices")
    run = tmp_path / "run"
    first = Trainer(assemble(_cfg(run, 3, *extra)))
    history = first.fit()
    assert len(history) == 3 and all(h["time/sync_s"] > 0 for h in history)
    want = ("broadcast", "nccl") if layout == "split" else ("directory", "")
    assert (first.parts.sync.transfer.mode, first.parts.sync.transfer.backend) == want
    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000003")
    resumed = Trainer(assemble(_cfg(run, 4, *extra), resume=True))
    more = resumed.fit()
    assert len(more) == 1 and (run / "checkpoints" / "latest").read_text().strip() == "step_000004"
