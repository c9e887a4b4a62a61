"""Sequence parallelism without processes: the shards of a micro-batch (global positions, the next-token
boundary between shards, padding to a multiple of S), the placement checks, the refused combinations, and
the worker group's routing of one share to every rank of a sequence-parallel block."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen3Config

from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks.worker_group import LocalRank, RankGroup
from memrl.training.update import ulysses as U
from memrl.training.update.packing import collate, weigh
from memrl.types import Segment


def _row(prompt: list[int], response: list[int], traj: str = "t") -> Segment:
    n = len(response)
    return Segment(prompt, response, [-float(i + 1) for i in range(n)], loss_mask=[1] * n, advantage=0.5,
                   trajectory_id=traj)


def test_shards_cover_the_row_with_global_positions_and_the_next_shard_token_as_target():
    rows = [_row([10, 11, 12], [13, 14, 15, 16]), _row([20, 21], [22, 23])]  # 7 and 4 tokens: L = 7
    mb = collate(rows, [0.25, 0.25])
    for size in (2, 3, 4):
        c = -(-7 // size)
        parts = [U.shard(mb, size, r) for r in range(size)]
        for r, p in enumerate(parts):
            assert p.input_ids.shape == p.targets.shape == p.loss_mask.shape == p.position_ids.shape == (2, c)
            assert p.position_ids[0].tolist() == list(range(r * c, (r + 1) * c))
            # each shard's last target is the next shard's first token (0 = padding after the row's end)
            if r + 1 < size:
                assert p.targets[:, -1].tolist() == parts[r + 1].input_ids[:, 0].tolist()
        for name in ("input_ids", "attention_mask"):
            assert U.unshard([getattr(p, name) for p in parts], 7).tolist() == getattr(mb, name).tolist()
        for name in ("targets", "loss_mask", "old_logprobs", "advantages", "weights"):
            assert U.unshard([getattr(p, name) for p in parts], 6).tolist() == getattr(mb, name).tolist(), name
        padded = torch.cat([p.attention_mask for p in parts], 1)
        assert padded[:, 7:].sum() == 0 and float(torch.cat([p.weights for p in parts], 1).sum()) == 1.5


def test_placement_checks_are_one_line_errors():
    def qwen2(heads: int, kv: int, **kw) -> Qwen2Config:
        return Qwen2Config(hidden_size=heads * 8, num_attention_heads=heads, num_key_value_heads=kv, **kw)

    U.check_model(qwen2(4, 2), 2)
    U.check_model(qwen2(4, 1), 2)  # KV heads repeated
    U.check_model(qwen2(8, 2), 4)
    U.check_model(Qwen3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8), 4)
    with pytest.raises(ValueError, match=r"^trainer.sequence_parallel=3 must divide the model's num_attention_heads=4$"):
        U.check_model(qwen2(4, 2), 3)
    with pytest.raises(ValueError, match="sequence_parallel=4 and num_key_value_heads=6: one must divide the other"):
        U.check_model(qwen2(12, 6), 4)
    with pytest.raises(ValueError, match="sliding-window attention is not supported"):
        U.check_model(qwen2(4, 2, use_sliding_window=True, sliding_window=16, max_window_layers=0), 2)
    with pytest.raises(ValueError, match="model type 'llama' is not supported"):
        from transformers import LlamaConfig  # noqa: PLC0415 - only this check needs it

        U.check_model(LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2), 2)


def _cfg(*ov: str) -> TrainConfig:
    cfg = load_config(TrainConfig, ["model.path=x", "rollout.num_engines=1", *ov])
    cfg.check()
    return cfg


def test_config_refuses_what_sequence_parallelism_does_not_split():
    assert _cfg().trainer.sequence_parallel == 1
    _cfg("trainer.num_workers=4", "trainer.sequence_parallel=2")
    for ov, msg in ((("trainer.num_workers=3", "trainer.sequence_parallel=2"),
                     "trainer.sequence_parallel=2 must divide trainer.num_workers=3"),
                    (("trainer.num_workers=2", "trainer.sequence_parallel=2", "model.lora.rank=8"),
                     r"does not support model.lora.rank > 0 \(LoRA\)"),
                    (("trainer.num_workers=2", "trainer.sequence_parallel=2", "trainer.router_aux_loss_coef=0.001"),
                     "does not support trainer.router_aux_loss_coef > 0")):
        with pytest.raises(ConfigError, match=msg):
            _cfg(*ov)


class _Rank:
    def __init__(self, rank: int) -> None:
        self.rank, self.calls = rank, []

    def train_rows(self, share, step_scheduler):
        self.calls.append([s.prompt_ids[0] for s in share.segments])
        return {"rank": float(self.rank)}

    def old_logprobs(self, rows):
        return [[float(r.prompt_ids[0]), float(self.rank)] for r in rows]


def test_rank_group_gives_each_sequence_parallel_block_one_share():
    ranks = [_Rank(i) for i in range(4)]
    group = RankGroup([LocalRank(r) for r in ranks], sequence_parallel=2)
    rows = [_row([i] * (9 - i), [1]) for i in range(4)]  # lengths 10, 9, 8, 7: 0 -> block 0, 1 -> 1, 2 -> 1, 3 -> 0
    group.train_rows(weigh(rows, "token-mean"))
    assert [r.calls for r in ranks] == [[[0, 3]], [[0, 3]], [[1, 2]], [[1, 2]]]
    # each row's log-probs from the first rank of its block, in the rows' order
    assert group.old_logprobs(rows) == [[0.0, 0.0], [1.0, 2.0], [2.0, 2.0], [3.0, 0.0]]
    with pytest.raises(ValueError, match="sequence_parallel=3 must divide the 4 ranks"):
        RankGroup([LocalRank(r) for r in ranks], sequence_parallel=3)
