"""LoRA training with vLLM rollouts (real vLLM on CPU, float32): the in-process engine and a Ray-placed
replica (directory sync) get the merged weights (W + scaling * B A under the base model's names: vLLM needs
no LoRA support), rollout.sync_check proves it after every sync, and the check stops the run naming the
engine when the in-process sync is removed. With lora_sync=adapter the adapter itself reaches in-process
vLLM (its LoRA support) and a vLLM OpenAI server (/v1/load_lora_adapter; a second server of its own, started
with --enable-lora), proved the same way. Needs peft in .venv-vllm (docs/guides/lora.md)."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request

import pytest
from doubles import local_ray, register_parity_workflow

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
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    t = Trainer(assemble(_cfg(str(tiny_model), tmp_path / "run", "engine=vllm-cpu")))
    history = t.fit()
    assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
    assert all(h["time/sync_check_s"] > 0 for h in history)


def test_in_process_vllm_without_the_sync_stops_the_run(tiny_model, tmp_path, monkeypatch):
    from memrl.engines.vllm import VLLMEngine
    from memrl.training.assemble import assemble
    from memrl.training.sync.sync_check import SyncCheckError
    from memrl.training.trainer import Trainer

    monkeypatch.setattr(VLLMEngine, "update_weights", lambda self, weights: None)
    t = Trainer(assemble(_cfg(str(tiny_model), tmp_path / "run", "engine=vllm-cpu")))
    with pytest.raises(SyncCheckError) as e:
        t.fit()
    assert str(e.value).startswith("rollout.sync_check failed after the update of step 1: engine vllm-cpu "
                                   "(in process) gives logprob ")


@pytest.fixture(scope="module")
def ray_session():
    pytest.importorskip("ray")
    with local_ray(3):
        yield


def test_ray_vllm_replica_gets_the_merged_weights(ray_session, tiny_model, tmp_path):
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    t = Trainer(assemble(_cfg(str(tiny_model), tmp_path / "run", "engine=vllm", "rollout.num_engines=1",
                     "rollout.cpus_per_engine=1", "rollout.weight_sync=directory")))
    history = t.fit()
    assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
    names = os.listdir(tmp_path / "run" / "engine_weights")
    assert names == ["model.safetensors"]


def test_vllm_server_reloads_the_merged_directory(vllm_server, tiny_model, tmp_path):
    """engine=openai against a real vLLM server: the trainer writes the merged HuggingFace directory to
    engine.openai.sync_dir after every update, the server reloads it (/collective_rpc), and the probe proves
    the server serves the trained weights. The server gets the base weights back afterwards."""
    from memrl.engines.openai_http import OpenAIEngine
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    sync_dir = tmp_path / "sync"
    try:
        t = Trainer(assemble(_cfg(str(tiny_model), tmp_path / "run", "engine=openai",
                         f"engine.openai.base_url={vllm_server.url}/v1", f"engine.model={tiny_model}",
                         f"engine.openai.sync_dir={sync_dir}")))
        history = t.fit()
        assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
        assert not any("adapter" in p.name for p in sync_dir.iterdir())
    finally:
        from transformers import AutoTokenizer

        eng = OpenAIEngine(base_url=f"{vllm_server.url}/v1", tokenizer=AutoTokenizer.from_pretrained(tiny_model))
        eng.update_weights(str(tiny_model))
        asyncio.run(eng.close())


def test_in_process_vllm_serves_the_adapter_after_every_sync(tiny_model, tmp_path):
    """engine.vllm.lora_sync=adapter: vLLM built with enable_lora, every sync a new LoRARequest."""
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    t = Trainer(assemble(_cfg(str(tiny_model), tmp_path / "run", "engine=vllm-cpu", "engine.vllm.lora_sync=adapter")))
    engine = t.parts.engine  # fit() closes it
    assert engine.config.max_lora_rank == 4
    history = t.fit()
    assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
    assert all(h["time/sync_load_s"] > 0 and h["time/sync_write_s"] > 0 for h in history)
    assert engine.adapter == "memrl-lora-3"  # before the first rollout + after each of 2 updates
    root = tmp_path / "run" / "engine_adapter"
    assert os.listdir(root) == ["adapter-3"]  # earlier versions deleted once the new one is served
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(root / "adapter-3"))


def test_in_process_vllm_adapter_without_the_sync_stops_the_run(tiny_model, tmp_path, monkeypatch):
    from memrl.engines.vllm import VLLMEngine
    from memrl.training.assemble import assemble
    from memrl.training.sync.sync_check import SyncCheckError
    from memrl.training.trainer import Trainer

    monkeypatch.setattr(VLLMEngine, "load_adapter", lambda self, path: "dropped")
    t = Trainer(assemble(_cfg(str(tiny_model), tmp_path / "run", "engine=vllm-cpu", "engine.vllm.lora_sync=adapter")))
    with pytest.raises(SyncCheckError) as e:
        t.fit()
    assert str(e.value).startswith("rollout.sync_check failed after the update of step 1: engine vllm-cpu "
                                   "(in process) gives logprob ")


@pytest.fixture(scope="module")
def lora_server(tiny_model, tmp_path_factory):
    """A vLLM OpenAI server of its own with dynamic LoRA loading (the shared one keeps its flags)."""
    from conftest import VLLMServer

    server = VLLMServer(tiny_model, tmp_path_factory.mktemp("vllm-lora-server") / "server.log",
                        extra_args=("--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"),
                        extra_env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def _served(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as r:
        return sorted(m["id"] for m in json.load(r)["data"])


def _lora_run(model, out, server, sync_dir, *extra: str) -> TrainConfig:
    return _cfg(str(model), out, "engine=openai", f"engine.openai.base_url={server.url}/v1", f"engine.model={model}",
                f"engine.openai.sync_dir={sync_dir}", "engine.openai.lora_sync=adapter", *extra)


def test_vllm_server_loads_the_adapter_after_every_sync(lora_server, tiny_model, tmp_path):
    """engine.openai.lora_sync=adapter: each sync POSTs /v1/load_lora_adapter with a new name, requests name
    it, the previous one is unloaded: after the run the server serves the base and the last adapter only."""
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    sync_dir = tmp_path / "sync"
    t = Trainer(assemble(_lora_run(tiny_model, tmp_path / "run", lora_server, sync_dir)))
    engine = t.parts.engine  # fit() closes its client; its adapter stays loaded on the server
    try:
        history = t.fit()
        assert [h["sync/probe_max_abs_diff"] <= 1e-3 for h in history] == [True, True]
        name = engine.adapter
        assert name.startswith("memrl-lora-") and name.endswith("-3")
        assert _served(lora_server.url) == sorted([str(tiny_model), name])
        assert os.listdir(sync_dir) == ["adapter-3"]
    finally:
        engine.unload_adapter()
    assert _served(lora_server.url) == [str(tiny_model)]


def test_vllm_server_adapter_without_the_sync_stops_the_run(lora_server, tiny_model, tmp_path, monkeypatch):
    from memrl.engines.openai_http import OpenAIEngine
    from memrl.training.assemble import assemble
    from memrl.training.sync.sync_check import SyncCheckError
    from memrl.training.trainer import Trainer

    monkeypatch.setattr(OpenAIEngine, "load_adapter", lambda self, path: "dropped")
    t = Trainer(assemble(_lora_run(tiny_model, tmp_path / "run", lora_server, tmp_path / "sync")))
    with pytest.raises(SyncCheckError) as e:
        t.fit()
    assert str(e.value).startswith("rollout.sync_check failed after the update of step 1: engine openai "
                                   f"({lora_server.url}/v1) gives logprob ")
    assert _served(lora_server.url) == [str(tiny_model)]


def test_vllm_server_refusing_an_adapter_names_the_endpoint(lora_server, tiny_model, tmp_path):
    from memrl.engines.base import EngineError
    from memrl.engines.openai_http import OpenAIEngine

    eng = OpenAIEngine(base_url=f"{lora_server.url}/v1", tokenizer=None)
    with pytest.raises(EngineError) as e:
        eng.load_adapter(str(tmp_path / "missing"))
    msg = str(e.value)
    assert msg.startswith(f"{lora_server.url}/v1/load_lora_adapter: HTTP ") and "\n" not in msg
    assert eng.adapter is None and _served(lora_server.url) == [str(tiny_model)]


def test_server_without_dynamic_lora_refuses_in_one_line(vllm_server, tmp_path):
    """The shared server runs without VLLM_ALLOW_RUNTIME_LORA_UPDATING: the route is missing."""
    from memrl.engines.base import EngineError
    from memrl.engines.openai_http import OpenAIEngine

    eng = OpenAIEngine(base_url=f"{vllm_server.url}/v1", tokenizer=None)
    with pytest.raises(EngineError) as e:
        eng.load_adapter(str(tmp_path))
    assert str(e.value) == (f"{vllm_server.url}/v1/load_lora_adapter: not found (start vLLM with --enable-lora "
                            "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
