"""Ray placement on CPU: 2 FSDP2 trainer ranks (gloo) and 2 transformers rollout engines train the tiny
model with weights synced by gloo broadcast, write a checkpoint AutoModelForCausalLM loads, and resume
exactly (synced through the object store); world size 1 with a replica synced by directory; replicas are
built from the whole engine section; bad placements fail first.

One Ray session for the module (temp dir inside the test's tmp folder, auth off), shut down at the end.
"""

from __future__ import annotations

import pytest
import torch
from doubles import local_ray, register_parity_workflow
from safetensors.torch import load_file

from memrl.config import ConfigError, load_config
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.ranks.distributed import free_port
from memrl.training.ranks.placement import PlacementError
from memrl.training.trainer import Trainer

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


register_parity_workflow("memagent_parity_ray")


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory):
    with local_ray(4, tmp_path_factory.mktemp("r")):
        yield


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _cfg(model: str, out, steps: int, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, [
        f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memagent_parity_ray",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6",
        "workflow.max_final_tokens=3", "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8",
        "trainer.batch_size=2", "algorithm.n=3", "algorithm.kl_coef=0.01", "optim.lr=1e-3",
        "optim.warmup_steps=2", "trainer.save_every=2", "trainer.token_budget=600", "trainer.progress=false",
        "trainer.tensorboard=false", "trainer.num_workers=2", "trainer.cpus_per_worker=0.5",
        "rollout.num_engines=2", "rollout.cpus_per_engine=0.5", *extra,
    ])


def test_two_ranks_two_engines_train_save_and_resume_exactly(ray_session, tiny_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from memrl.training.checkpoints.checkpoint import read_optimizer

    run = tmp_path / "run"
    synced: list[int] = []

    def check_sync(step: int, metrics: dict[str, float]) -> None:
        """After each step's sync, every replica serves exactly the trainer's gathered weights."""
        want = {k: float(v.double().sum()) for k, v in first.parts.workers.full_state().items()}
        for got in first.parts.engine.param_sums():
            assert {k: got[k] for k in want} == want
        synced.append(step)

    first = Trainer(assemble(_cfg(tiny_path, run, 3, "rollout.weight_sync=broadcast", "rollout.broadcast_bucket_mb=1",
                         "engine.hf.max_prefill_tokens=4096", "engine.seed=7")), on_step=check_sync)
    assert (first.parts.sync.transfer.mode, first.parts.sync.transfer.backend) == ("broadcast", "gloo")
    for got in first.parts.engine.settings():  # the whole engine section reached every replica
        assert (got.name, got.seed, got.hf.max_prefill_tokens, got.hf.device) == ("hf", 7, 4096, "cpu")
        assert got.hf.deterministic and got.model == tiny_path
    history = first.fit()
    assert synced == [1, 2, 3]
    assert first.parts.sync.transfer.joined and set(first.parts.sync.transfer.last) == {"gather_s", "send_s", "load_s"}
    assert all(h["time/sync_s"] >= h["time/sync_send_s"] + h["time/sync_gather_s"] for h in history)
    assert len(history) == 3
    assert all(h["time/sync_s"] > 0 and h["train/rows"] > 0 for h in history)
    assert any(h["advantage/std"] > 0 for h in history)  # the policy gradient was not zero
    assert all(n > 0 for n in first.parts.engine.served), first.parts.engine.served  # both replicas took requests
    ckpt = run / "checkpoints" / "step_000003"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"
    loaded = AutoModelForCausalLM.from_pretrained(ckpt).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_path).state_dict()
    assert any(not torch.equal(base[k], loaded[k]) for k in base), "3 steps did not change any weight"

    # One replica is enough to resume (and starts one process fewer); the ranks stay at 2.
    resumed = Trainer(assemble(_cfg(tiny_path, run, 4, "rollout.num_engines=1"), resume=True))
    assert resumed.parts.sync.transfer.mode == "object_store"  # auto, for hf replicas
    assert (resumed.step, resumed.state.position) == (3, first.state.position)
    saved = load_file(str(ckpt / "model.safetensors"))
    got = resumed.parts.workers.full_state()
    for k, v in saved.items():
        assert torch.equal(got[k], v), k
    opt_saved = read_optimizer(ckpt)  # the DCP shards of 2 ranks, read in one process
    opt_got = resumed.parts.workers.optim_state()
    assert opt_got["state"].keys() == opt_saved["state"].keys()
    for name, st in opt_saved["state"].items():
        for k, v in st.items():
            assert torch.equal(opt_got["state"][name][k], v), (name, k)
    more = resumed.fit()
    assert len(more) == 1 and more[0]["data/position"] == first.state.position + 2
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000004"


def test_world_size_one_syncs_a_replica_through_a_directory(ray_session, tiny_path, tmp_path):
    run = tmp_path / "run"

    def check_sync(step: int, metrics: dict[str, float]) -> None:
        want = {k: float(v.double().sum()) for k, v in t.parts.workers.full_state().items()}
        (got,) = t.parts.engine.param_sums()
        assert {k: got[k] for k in want} == want

    t = Trainer(assemble(_cfg(tiny_path, run, 2, "trainer.num_workers=1", "rollout.num_engines=1",
                     "rollout.weight_sync=directory", "algorithm.kl_coef=0")), on_step=check_sync)
    history = t.fit()
    assert len(history) == 2 and t.parts.sync.transfer.mode == "directory"
    synced = load_file(str(run / "engine_weights" / "model.safetensors"))
    for k, v in synced.items():
        assert torch.equal(v, t.model.state_dict()[k]), k


def test_more_workers_than_cpus_fails_before_work(ray_session, tiny_path, tmp_path):
    with pytest.raises(PlacementError, match=r"trainer.num_workers=8 .* asks for 9 CPUs, but the Ray cluster has 4"):
        assemble(_cfg(tiny_path, tmp_path / "r", 1, "trainer.num_workers=8", "trainer.cpus_per_worker=1"))


def test_gpus_asked_without_gpu_fail_before_work(ray_session, tiny_path, tmp_path):
    with pytest.raises(PlacementError, match="asks for 2 GPUs, but the Ray cluster has no GPU"):
        assemble(_cfg(tiny_path, tmp_path / "r", 1, "trainer.gpus_per_worker=1"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="model.device=cuda but torch.cuda.is_available"):
            assemble(_cfg(tiny_path, tmp_path / "r", 1, "model.device=cuda"))


def test_unreachable_ray_address_fails_before_work(tiny_path, tmp_path):
    port = free_port()
    with pytest.raises(PlacementError, match=f"ray.address 127.0.0.1:{port}: cannot reach 127.0.0.1:{port}"):
        assemble(_cfg(tiny_path, tmp_path / "r", 1, f"ray.address=127.0.0.1:{port}"))


def test_many_workers_need_ray_engines(tiny_path, tmp_path):
    with pytest.raises(ConfigError, match="trainer.num_workers=2 needs rollout.num_engines >= 1"):
        assemble(_cfg(tiny_path, tmp_path / "r", 1, "rollout.num_engines=0"))


def test_async_replica_samples_during_the_update_and_serves_each_version(ray_session, tiny_path, tmp_path):
    """rollout.max_staleness=1 with the trainer in the driver and one hf replica (the benchmark's placement):
    after every sync the replica serves exactly the trainer's weights, while between syncs it sampled the
    next step's batch on the previous ones (staleness 1 reaches the loss, never more)."""
    run = tmp_path / "run"
    seen: list[dict[str, float]] = []

    def check_sync(step: int, metrics: dict[str, float]) -> None:
        want = {k: float(v.double().sum()) for k, v in t.parts.workers.full_state().items()}
        (got,) = t.parts.engine.param_sums()
        assert {k: got[k] for k in want} == want
        seen.append(metrics)

    t = Trainer(assemble(_cfg(tiny_path, run, 3, "trainer.num_workers=1", "rollout.num_engines=1", "algorithm.kl_coef=0",
                     "rollout.max_staleness=1")), on_step=check_sync)
    history = t.fit()
    assert len(seen) == 3 and t.parts.sync.transfer.mode == "object_store"
    assert [h["async/policy_version"] for h in history] == [0.0, 1.0, 2.0]
    assert [h["async/staleness_max"] for h in history] == [0.0, 1.0, 1.0]
    assert all(h["async/stale_dropped"] == 0 and 0 <= h["perf/trainer_idle_share"] <= 1 for h in history)
    assert all(0 <= h["perf/engine_idle_share"] <= 1 for h in history[1:])  # the replica counts its busy time
    assert [h["data/position"] for h in history] == [2.0, 4.0, 6.0]
