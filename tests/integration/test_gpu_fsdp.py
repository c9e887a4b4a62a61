"""The FSDP2 / NCCL / DCP path on CUDA (marked gpu, skipped without CUDA).

One device is enough for the first test: an NCCL process group of ONE rank makes PolicyWorker shard the
model with `fully_shard` (DTensor parameters, the same code as N ranks), so the update, the gathered state
dict and the sharded DCP optimizer checkpoint run on CUDA through NCCL. NCCL refuses two ranks on one
device, so the 2-rank NCCL broadcast of weights needs 2 devices (skipped otherwise).

Tolerances: FSDP2 at world size 1 vs the plain module, float32 on the same device, TF32 off: loss 1e-6,
weights 1e-6 (the math is the same; only the flat-shard layout differs; measured on an H100: equal to
the last bit). bf16 compute (MixedPrecisionPolicy, fp32 reduction) vs fp32: loss within 1e-3, grad norm
within 1% (measured on an H100: 4e-6 and 0.16%).
"""

from __future__ import annotations

import random
import threading

import pytest
import torch

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.update.packing import TrainBatch, weigh
from memrl.types import Segment

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny", tmp_path_factory.getbasetemp() / "memrl-models"))


def _rows(seed: int, vocab: int) -> TrainBatch:
    rng = random.Random(seed)
    rows = []
    for i in range(9):
        p, n = rng.randint(3, 20), rng.randint(1, 12)
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-rng.uniform(0.5, 9.0) for _ in range(n)], advantage=rng.uniform(-1, 1),
                            trajectory_id=f"t{i % 4}"))
    return weigh(rows, "token-mean")  # loss_agg's default


def _cfg(model: str, bf16: bool) -> TrainConfig:
    return load_config(TrainConfig, [f"model.path={model}", "model.device=cuda", "algorithm.kl_coef=0.05",
                                     "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=60",
                                     f"trainer.fsdp_bf16={str(bf16).lower()}"])


def _maxdiff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def _same_optim(a: dict, b: dict) -> None:
    assert a["state"].keys() == b["state"].keys()
    for name, st in a["state"].items():
        for k, v in st.items():
            assert torch.equal(v.cpu(), b["state"][name][k].cpu()), (name, k)


def test_fsdp2_in_an_nccl_group_of_one_equals_plain_and_resumes_from_dcp(tiny_path, tmp_path):
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from transformers import AutoConfig

    from memrl.training.checkpoints.checkpoint import read_optimizer
    from memrl.training.ranks import distributed as D
    from memrl.training.ranks.workers import PolicyWorker

    torch.backends.cuda.matmul.allow_tf32 = False
    vocab = AutoConfig.from_pretrained(tiny_path).vocab_size
    plain = PolicyWorker(_cfg(tiny_path, False))
    m_plain = plain.train_rows(_rows(1, vocab))
    w_plain = plain.full_state()
    m_plain2 = plain.train_rows(_rows(2, vocab))
    del plain
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{D.free_port()}", rank=0, world_size=1)
    try:
        sh = PolicyWorker(_cfg(tiny_path, False))
        assert isinstance(next(sh.model.parameters()), DTensor)  # fully_shard ran, at world size 1
        m_sh = sh.train_rows(_rows(1, vocab))
        w_sh = sh.full_state()
        d = _maxdiff(w_plain, w_sh)
        print(f"FSDP2 (NCCL, 1 rank) vs plain on cuda: loss {m_sh['loss/total']:.8f} vs "
              f"{m_plain['loss/total']:.8f}, grad norm {m_sh['train/grad_norm']:.6f} vs "
              f"{m_plain['train/grad_norm']:.6f}, weights {d:.2e}")
        assert abs(m_sh["loss/total"] - m_plain["loss/total"]) < 1e-6
        assert d < 1e-6
        ck = sh.save(str(tmp_path / "ck"), 1, {"step": 1, "data_position": 0})
        saved = D.full_optim_state(sh.model, sh.opt)
        again = PolicyWorker(_cfg(tiny_path, False), start=ck)
        _same_optim(D.full_optim_state(again.model, again.opt), saved)
        assert _maxdiff(again.full_state(), w_sh) == 0.0
        m2, m2_again = sh.train_rows(_rows(2, vocab)), again.train_rows(_rows(2, vocab))
        assert m2 == m2_again  # resume through DCP on CUDA: the next step is bit-identical
        assert abs(m2["loss/total"] - m_plain2["loss/total"]) < 1e-6
        bf = PolicyWorker(_cfg(tiny_path, True))
        m_bf = bf.train_rows(_rows(1, vocab))
        print(f"bf16 compute vs fp32 (FSDP2, cuda): loss {m_bf['loss/total']:.6f} vs {m_sh['loss/total']:.6f}, "
              f"grad norm {m_bf['train/grad_norm']:.6f} vs {m_sh['train/grad_norm']:.6f}")
        assert abs(m_bf["loss/total"] - m_sh["loss/total"]) < 1e-3
        assert abs(m_bf["train/grad_norm"] - m_sh["train/grad_norm"]) < 0.01 * m_sh["train/grad_norm"]
    finally:
        dist.destroy_process_group()
    _same_optim(read_optimizer(ck), saved)  # the shards written under NCCL, read back in one plain process


def test_nccl_transfer_group_of_one_sends_cuda_buckets():
    """The sender side of the NCCL weight transfer on one device (a group of one: nobody receives)."""
    from memrl.engines.weight_transfer import TransferSpec, WeightTransfer
    from memrl.training.ranks.distributed import free_port

    weights = {"a": torch.randn(64, 32, device="cuda"), "b": torch.randn(1000, device="cuda").to(torch.bfloat16),
               "c": torch.arange(5, device="cuda")}
    t = WeightTransfer(TransferSpec("127.0.0.1", free_port(), 1, "nccl", bucket_bytes=4096), 0, "cuda:0")
    assert t.send(weights) == 64 * 32 * 4 + 1000 * 2 + 5 * 8
    assert t.send(weights, skip=("a",)) == 1000 * 2 + 5 * 8


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs 2 CUDA devices for a 2-member group")
def test_nccl_weight_broadcast_between_two_devices():
    from memrl.engines.weight_transfer import TransferSpec, WeightTransfer, receive_all
    from memrl.training.ranks.distributed import free_port

    g = torch.Generator().manual_seed(0)
    weights = {"a": torch.randn(64, 32, generator=g).to("cuda:0"),
               "b": torch.randn(1000, generator=g).to(torch.bfloat16).to("cuda:0")}
    spec = TransferSpec("127.0.0.1", free_port(), 2, "nccl", bucket_bytes=4096)
    got: dict[str, torch.Tensor] = {}
    errors: list[BaseException] = []

    def receiver() -> None:
        try:
            torch.cuda.set_device(1)
            got.update(receive_all(WeightTransfer(spec, 1, "cuda:1")))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=receiver)
    th.start()
    torch.cuda.set_device(0)
    WeightTransfer(spec, 0, "cuda:0").send(weights)
    th.join(timeout=120)
    assert not errors, errors
    for k, v in weights.items():
        assert got[k].device == torch.device("cuda:1") and torch.equal(got[k].cpu(), v.cpu()), k
