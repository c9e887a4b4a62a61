"""Scale-out planning without processes: the driver's token-balanced split of a weighed mini-batch, the
worker group's fan-out to its ranks, and the resource / address checks that run before Ray places anything."""

from __future__ import annotations

import pytest

from memrl.algorithms.losses import AGG_MODES, loss_token_weights
from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks.placement import PlacementError, check_address, check_resources, needs
from memrl.training.ranks.worker_group import LocalRank, RankGroup
from memrl.training.update.packing import TrainBatch, split, split_rows, weigh
from memrl.types import Segment


def _row(n_prompt: int, mask: list[int], traj: str = "t") -> Segment:
    return Segment([1] * n_prompt, [2] * len(mask), [0.0] * len(mask), loss_mask=mask, advantage=1.0,
                   trajectory_id=traj)


def test_split_rows_balances_tokens_longest_first():
    rows = [_row(p, [1]) for p in (9, 2, 7, 4, 5, 1)]  # lengths 10, 3, 8, 5, 6, 2
    # 10 -> r0; 8 -> r1; 6 -> r1 (8 < 10); 5 -> r0 (10 < 14); 3 -> r1 (14 < 15); 2 -> r0 (15 < 17): 17 / 17
    assert split_rows(rows, 2) == [[0, 3, 5], [1, 2, 4]]
    assert split_rows(rows, 1) == [[0, 1, 2, 3, 4, 5]]
    assert split_rows(rows[:1], 3) == [[0], [], []]


def test_driver_weighs_once_and_each_rank_gets_its_rows_with_the_whole_batch_weights():
    rows = [_row(2, [1, 1, 0], "a"), _row(3, [0, 0], "a"), _row(1, [1, 1, 1, 1], "b"), _row(2, [1], "c")]
    for mode in AGG_MODES:  # spread over the tokens, one weight per row is the per-token weighting
        b = weigh(rows, mode)
        want = loss_token_weights([r.loss_mask for r in rows], [r.trajectory_id for r in rows], mode)
        assert [[w if v else 0.0 for v in r.loss_mask] for r, w in zip(rows, b.weights, strict=True)] == want, mode
    b = weigh(rows, "token-mean")  # 7 trained tokens; row 1 trains none
    assert b.weights == [1 / 7, 0.0, 1 / 7, 1 / 7] and b.batch_rows == 4
    # lengths 5, 5, 5, 3: 5 -> r0, 5 -> r1, 5 -> r0 (5 = 5, lower rank), 3 -> r1 (8 > 5)
    left, right = split(b, 2)
    assert (left.segments, left.weights, left.batch_rows) == ([rows[0], rows[2]], [1 / 7, 1 / 7], 4)
    assert (right.segments, right.weights, right.batch_rows) == ([rows[1], rows[3]], [0.0, 1 / 7], 4)
    assert left.weight_sum() == pytest.approx(6 / 7) and right.weight_sum() == 1 / 7  # 2 + 4 and 0 + 1 tokens
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'mean'"):
        weigh(rows, "mean")
    with pytest.raises(ValueError, match="TrainBatch: 4 segments but 3 weights"):
        TrainBatch(rows, [1.0] * 3)


class _Rank:
    """A rank that records its calls (rank 0 of a group answers for it)."""

    def __init__(self, rank: int) -> None:
        self.rank, self.calls = rank, []

    def train_rows(self, share, step_scheduler):
        self.calls.append(("train_rows", [s.prompt_ids for s in share.segments], share.weights, step_scheduler))
        return {"rank": float(self.rank)}

    def engine_weights(self):
        return {"w": self.rank}

    def save(self, root, step, state, keep, extra):
        self.calls.append(("save", root, step, keep))
        return f"{root}/step_{step:06d}"

    def close(self):
        self.calls.append(("close",))


def test_rank_group_sends_each_rank_only_its_share_and_answers_with_rank_0():
    ranks = [_Rank(0), _Rank(1)]
    released = []
    group = RankGroup([LocalRank(r) for r in ranks], release=lambda: released.append(True))
    rows = [_row(4, [1]), _row(1, [1, 1]), _row(2, [1])]  # lengths 5, 3, 3: 5 -> r0, 3 -> r1, 3 -> r1
    assert group.train_rows(weigh(rows, "seq-mean-token-sum"), step_scheduler=False) == {"rank": 0.0}
    assert ranks[0].calls == [("train_rows", [[1] * 4], [1 / 3], False)]
    assert ranks[1].calls == [("train_rows", [[1], [1] * 2], [1 / 3, 1 / 3], False)]
    assert group.weights_for_engines() == {"w": 0}
    assert str(group.save("/ck", 3, {}, keep=2)) == "/ck/step_000003"
    assert (group.world_size, group.model, group.opt, group.pg) == (2, None, None, None)
    group.close()
    group.close()  # the release runs once
    assert ranks[1].calls[-1] == ("close",) and released == [True]
    with pytest.raises(ValueError, match="RankGroup: no ranks"):
        RankGroup([])


def _cfg(*ov: str) -> TrainConfig:
    return load_config(TrainConfig, ["model.path=x", *ov])


def test_resources_needed_split_and_colocated():
    split = _cfg("trainer.num_workers=4", "trainer.gpus_per_worker=1", "trainer.cpus_per_worker=2",
                 "rollout.num_engines=2", "rollout.gpus_per_engine=1", "rollout.cpus_per_engine=1")
    assert needs(split) == (10.0, 6.0)
    colo = _cfg("trainer.num_workers=4", "trainer.gpus_per_worker=1", "trainer.cpus_per_worker=2",
                "rollout.num_engines=4", "rollout.colocate=true", "rollout.cpus_per_engine=1")
    assert needs(colo) == (12.0, 4.0)
    assert needs(_cfg("rollout.num_engines=1")) == (1.0, 0.0)  # world size 1 trains in the driver
    check_resources(split, {"CPU": 10, "GPU": 6})
    with pytest.raises(PlacementError, match="asks for 6 GPUs, but the Ray cluster has 4"):
        check_resources(split, {"CPU": 64, "GPU": 4})
    with pytest.raises(PlacementError, match="asks for 10 CPUs, but the Ray cluster has 8"):
        check_resources(split, {"CPU": 8, "GPU": 8})
    with pytest.raises(PlacementError, match="rollout.colocate needs trainer.num_workers > 1"):
        check_resources(_cfg("rollout.num_engines=1", "rollout.colocate=true"), {"CPU": 8})
    with pytest.raises(ConfigError, match="""rollout.engine='sglang' is not allowed: must be one of "", hf, vllm"""):
        _cfg("rollout.num_engines=1", "rollout.engine=sglang")  # refused when the config is read


def test_malformed_ray_address_is_named():
    with pytest.raises(PlacementError, match=r"ray.address 'headnode' is not host:port"):
        check_address("headnode")
    check_address("")  # local Ray
    check_address("auto")


def test_eight_gpu_preset_places_eight_colocated_ranks():
    cfg = load_config(TrainConfig, ["model.path=x"], "memagent_grpo_8gpu")
    assert (cfg.trainer.num_workers, cfg.rollout.num_engines, cfg.rollout.colocate) == (8, 8, True)
    assert needs(cfg) == (64.0, 8.0)
    check_resources(cfg, {"CPU": 64, "GPU": 8})


def test_replicas_take_the_whole_engine_section():
    from memrl.training.ranks.placement import replica_engine_config, replica_kind

    cfg = _cfg("engine=vllm", "engine.seed=3", "engine.max_batch_size=32", "engine.vllm.max_model_len=2048",
               "engine.vllm.enforce_eager=true", "engine.hf.max_prefill_tokens=100", "trainer.num_workers=2",
               "trainer.gpus_per_worker=1", "rollout.num_engines=2", "rollout.colocate=true",
               "rollout.gpu_memory_utilization=0.3", "trainer.fsdp_bf16=true")
    assert replica_kind(cfg) == "vllm"  # rollout.engine empty: engine.name
    e = replica_engine_config(cfg, "/ckpt/step_000002", 0.5)
    assert (e.name, e.model, e.seed, e.max_batch_size, e.dtype) == ("vllm", "/ckpt/step_000002", 3, 32, "bfloat16")
    assert (e.vllm.max_model_len, e.vllm.enforce_eager, e.vllm.gpu_memory_utilization) == (2048, True, 0.3)
    assert e.vllm.enable_sleep_mode  # colocated on GPUs: sleeps during the update
    assert e.hf.max_prefill_tokens == 100 and e.hf.device == "cuda"
    hf = replica_engine_config(_cfg("rollout.num_engines=1", "engine.dtype=float32", "engine.hf.max_wait_ms=9"),
                               "/m", 0)
    assert (hf.name, hf.dtype, hf.hf.device, hf.hf.max_wait_ms, hf.hf.share_weights) == ("hf", "float32", "cpu", 9, False)
    assert replica_kind(_cfg("engine=vllm-cpu")) == "vllm"
    assert replica_kind(_cfg("engine=vllm", "rollout.engine=hf")) == "hf"
    with pytest.raises(PlacementError, match=r"engine.name \(rollout.engine is empty\) 'openai' is not hf or vllm"):
        check_resources(_cfg("rollout.num_engines=1", "engine=openai"), {"CPU": 8})


@pytest.mark.parametrize("overrides, mode, backend", [
    (("rollout.num_engines=2",), "object_store", ""),  # hf replicas
    (("rollout.num_engines=2", "rollout.engine=vllm"), "directory", ""),  # vLLM on CPU
    (("rollout.num_engines=2", "rollout.engine=vllm", "rollout.gpus_per_engine=1"), "broadcast", "nccl"),
    (("trainer.num_workers=2", "trainer.gpus_per_worker=1", "rollout.num_engines=2", "rollout.engine=vllm",
      "rollout.colocate=true"), "directory", ""),  # one GPU per rank + engine pair: no NCCL pair on it
    (("rollout.num_engines=2", "rollout.weight_sync=broadcast"), "broadcast", "gloo"),
    (("rollout.num_engines=2", "rollout.weight_sync=broadcast", "rollout.broadcast_backend=nccl"), "broadcast", "nccl"),
])
def test_weight_sync_auto_modes(overrides, mode, backend):
    from memrl.training.sync.weight_sync import broadcast_backend, resolve_mode

    cfg = _cfg(*overrides)
    assert resolve_mode(cfg) == mode
    if backend:
        assert broadcast_backend(cfg) == backend


def test_bad_weight_sync_settings_are_named(tmp_path):
    from memrl.models.tiny import cached_tiny_model
    from memrl.training.assemble import validate

    model = str(cached_tiny_model("tiny"))
    with pytest.raises(ConfigError, match="rollout.weight_sync='nccl' is not allowed: must be one of auto, object_store, broadcast, directory"):
        validate(load_config(TrainConfig, [f"model.path={model}", "rollout.weight_sync=nccl"]))
    with pytest.raises(ConfigError, match=r"rollout.weight_sync=directory applies to Ray replicas: it needs "
                                          r"rollout.num_engines >= 1"):
        validate(load_config(TrainConfig, [f"model.path={model}", "rollout.weight_sync=directory"]))
    with pytest.raises(ConfigError, match="rollout.broadcast_backend='mpi' is not allowed: must be one of auto, gloo, nccl"):
        validate(load_config(TrainConfig, [f"model.path={model}", "rollout.broadcast_backend=mpi"]))
