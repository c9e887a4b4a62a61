"""The broadcast weight-transfer group on gloo: a sender and two receivers (threads of this process, a real
TCPStore + ProcessGroupGloo each) get every tensor bit-identical, across bucket boundaries."""

from __future__ import annotations

import threading

import pytest
import torch

from memrl.engines.weight_transfer import TransferSpec, WeightTransfer, receive_all
from memrl.training.ranks.distributed import free_port


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(7, 5, generator=g),
        "b.weight": torch.randn(300, generator=g).to(torch.bfloat16),  # 600 bytes: a bucket of its own
        "c.ids": torch.arange(11, dtype=torch.int64),
        "d.scalar": torch.tensor(3.5),
        "e.half": torch.randn(2, 3, 4, generator=g).to(torch.float16).transpose(0, 2),  # not contiguous
        "lm_head.weight": torch.randn(7, 5, generator=g),
    }


def test_three_members_receive_every_tensor_exactly_in_buckets():
    spec = TransferSpec("127.0.0.1", free_port(), 3, "gloo", bucket_bytes=256)
    weights = _weights()
    got: dict[int, dict[str, torch.Tensor]] = {}
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            t = WeightTransfer(spec, rank)
            for _ in range(2):  # the group serves several syncs
                got[rank] = receive_all(t)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=member, args=(r,)) for r in (1, 2)]
    for th in threads:
        th.start()
    sender = WeightTransfer(spec, 0)
    sent = [sender.send(weights, skip=("lm_head.weight",)) for _ in range(2)]
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    want = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    assert sent == [sum(v.numel() * v.element_size() for v in want.values())] * 2
    for rank in (1, 2):
        assert list(got[rank]) == list(want)
        for k, v in want.items():
            assert got[rank][k].dtype == v.dtype and got[rank][k].shape == v.shape, k
            assert torch.equal(got[rank][k], v), k


def test_bad_specs_name_the_field():
    with pytest.raises(ValueError, match="weight transfer backend 'mpi' is not gloo or nccl"):
        TransferSpec("127.0.0.1", 1, 2, "mpi")
    with pytest.raises(ValueError, match="needs at least the sender, world_size=0"):
        TransferSpec("127.0.0.1", 1, 0)
    with pytest.raises(ValueError, match="weight transfer rank 2 is outside 0..1"):
        WeightTransfer(TransferSpec("127.0.0.1", 1, 2), 2)
