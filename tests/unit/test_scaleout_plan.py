"""Scale-out planning without processes: token-balanced row split, world-size-1 global weights, and the
resource / address checks that run before Ray places anything."""

from __future__ import annotations

import pytest

from memrl.algorithms.losses import AGG_MODES, loss_token_weights
from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.distributed import set_global_loss_weights, split_rows
from memrl.training.packing import Row
from memrl.training.placement import PlacementError, check_address, check_resources, needs


def _row(n_prompt: int, mask: list[int], traj: str = "t") -> Row:
    return Row([1] * n_prompt, [2] * len(mask), mask, [0.0] * len(mask), 1.0, traj)


def test_split_rows_balances_tokens_longest_first():
    rows = [_row(p, [1]) for p in (9, 2, 7, 4, 5, 1)]  # lengths 10, 3, 8, 5, 6, 2
    # 10 -> r0; 8 -> r1; 6 -> r1 (8 < 10); 5 -> r0 (10 < 14); 3 -> r1 (14 < 15); 2 -> r0 (15 < 17): 17 / 17
    assert split_rows(rows, 2) == [[0, 3, 5], [1, 2, 4]]
    assert split_rows(rows, 1) == [[0, 1, 2, 3, 4, 5]]
    assert split_rows(rows[:1], 3) == [[0], [], []]


def test_global_weights_at_world_size_one_equal_whole_batch_weights():
    rows = [_row(2, [1, 1, 0], "a"), _row(3, [0, 0], "a"), _row(1, [1, 1, 1, 1], "b"), _row(2, [1], "c")]
    for mode in AGG_MODES:
        set_global_loss_weights(rows, mode)
        want = loss_token_weights([r.loss_mask for r in rows], [r.trajectory_id for r in rows], mode)
        assert [r.weights for r in rows] == want, mode
    set_global_loss_weights(rows, "token-mean")
    assert rows[0].weights == [1 / 7, 1 / 7, 0.0]
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'mean'"):
        set_global_loss_weights(rows, "mean")


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
    with pytest.raises(PlacementError, match="rollout.engine 'sglang' is not hf or vllm"):
        check_resources(_cfg("rollout.num_engines=1", "rollout.engine=sglang"), {"CPU": 8})


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
