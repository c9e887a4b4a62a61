"""LoRA training with vLLM rollouts (real vLLM on CPU, float32): the in-process engine and a Ray-placed
replica (directory sync) get the merged weights (W + scaling * B A under the base model's names: vLLM needs
no LoRA support), rollout.sync_check proves it after every sync, and the check stops the run naming the
engine when the in-process sync is removed. Needs peft in .venv-vllm (docs/lora.md)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import pytest
from doubles import register_parity_workflow

from memrl.config import load_config
from memrl.training.config import TrainConfig

pytest.importorskip("peft")


register_parity_workflow("memagent_parity_vllm_lora")

VLLM_ENGINE = ["engine.dtype=float32", "engine.vllm.max_model_len=4096", "engine.vllm.enforce_eager=true",
               "engine.vllm.kv_cache_gib=0.5", "engine.max_batch_size=16"]


def _cfg(model: str, out, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", "trainer.steps=2", "workflow=memagent_parity_vllm_lora",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2",
        "algorithm.kl_coef=0", "optim.lr=5e-3", "optim.warmup_steps=0", "trainer.save_every=0",
        "trainer.progress=false", "trainer.tensorboard=false", "model.lora.rank=4", "model.lora.alpha=8",
        "rollout.sync_check=true", "rollout.sync_check_tol=1e-3", *VLLM_ENGINE, *extra,
    ])


def test_in_process_vllm_serves_the_merged_adapter_after_every_sync(tiny_model, tmp_path):
    from memrl.training.trainer import Trainer

    t = Trainer(_cfg(str(tiny_model), tmp_path / "run", "engine=vllm-cpu"))
    history = t.fit()
    assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
    assert all(h["time/sync_check_s"] > 0 for h in history)


def test_in_process_vllm_without_the_sync_stops_the_run(tiny_model, tmp_path, monkeypatch):
    from memrl.engines.vllm import VLLMEngine
    from memrl.training.sync_check import SyncCheckError
    from memrl.training.trainer import Trainer

    monkeypatch.setattr(VLLMEngine, "update_weights", lambda self, weights: None)
    t = Trainer(_cfg(str(tiny_model), tmp_path / "run", "engine=vllm-cpu"))
    with pytest.raises(SyncCheckError) as e:
        t.fit()
    assert str(e.value).startswith("rollout.sync_check failed after the update of step 1: engine vllm-cpu "
                                   "(in process) gives logprob ")


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    old = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp = tempfile.mkdtemp(prefix="rayl", dir="/tmp")  # Ray's socket paths must stay short
    ray.init(_temp_dir=temp, num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
    if old is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = old


def test_ray_vllm_replica_gets_the_merged_weights(ray_session, tiny_model, tmp_path):
    from memrl.training.trainer import Trainer

    t = Trainer(_cfg(str(tiny_model), tmp_path / "run", "engine=vllm", "rollout.num_engines=1",
                     "rollout.cpus_per_engine=1", "rollout.weight_sync=directory"))
    history = t.fit()
    assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
    names = os.listdir(tmp_path / "run" / "engine_weights")
    assert names == ["model.safetensors"]


def test_vllm_server_reloads_the_merged_directory(vllm_server, tiny_model, tmp_path):
    """engine=openai against a real vLLM server: the trainer writes the merged HuggingFace directory to
    engine.openai.sync_dir after every update, the server reloads it (/collective_rpc), and the probe proves
    the server serves the trained weights. The server gets the base weights back afterwards."""
    from memrl.engines.openai_http import OpenAIEngine
    from memrl.training.trainer import Trainer

    sync_dir = tmp_path / "sync"
    try:
        t = Trainer(_cfg(str(tiny_model), tmp_path / "run", "engine=openai",
                         f"engine.openai.base_url={vllm_server.url}/v1", f"engine.model={tiny_model}",
                         f"engine.openai.sync_dir={sync_dir}"))
        history = t.fit()
        assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
        assert not any("adapter" in p.name for p in sync_dir.iterdir())
    finally:
        from transformers import AutoTokenizer

        eng = OpenAIEngine(base_url=f"{vllm_server.url}/v1", tokenizer=AutoTokenizer.from_pretrained(tiny_model))
        eng.update_weights(str(tiny_model))
        asyncio.run(eng.close())
