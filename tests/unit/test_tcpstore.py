"""memrl's TCPStores (weight broadcast, multi-rank training) listen on the address they are given only.

Listening sockets are read from the kernel's tables (/proc/net/tcp and tcp6, state 0A = LISTEN), so the
tests are Linux-only. Addresses there are hex in host byte order: 127.0.0.1 -> "0100007F";
the IPv6 wildcard :: -> 32 zeros; IPv4 0.0.0.0 -> "00000000".
"""

from __future__ import annotations

import datetime
import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memrl.tcpstore import tcp_store
from memrl.training.ranks.distributed import free_port

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="reads Linux's /proc/net/tcp")

LOOPBACK_HEX = "0100007F"  # 127.0.0.1
ROOT = Path(__file__).parents[2]


def listeners(port: int) -> list[tuple[str, str]]:
    """(table, local address hex) of every socket listening on `port`."""
    out = []
    for table in ("tcp", "tcp6"):
        path = Path("/proc/net") / table
        if not path.is_file():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, port_hex = fields[1].split(":")
            if fields[3] == "0A" and int(port_hex, 16) == port:
                out.append((table, addr))
    return out


def _timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=20)


def test_torch_own_store_listens_on_every_interface():
    """The reason for memrl.tcpstore, recorded: torch 2.13's TCPStore given 127.0.0.1 binds the wildcard
    (IPv6 ::, which also takes IPv4). If this starts failing, torch binds the given host itself."""
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=_timeout(), wait_for_workers=False)
    try:
        assert listeners(port) in ([("tcp6", "0" * 32)], [("tcp", "00000000")])
    finally:
        del store
        gc.collect()


def test_memrl_store_listens_on_loopback_only_and_serves_clients():
    port = free_port()
    master = tcp_store("127.0.0.1", port, 2, is_master=True, timeout=_timeout(), wait_for_workers=False)
    assert listeners(port) == [("tcp", LOOPBACK_HEX)]
    client = tcp_store("127.0.0.1", port, 2, is_master=False, timeout=_timeout(), wait_for_workers=False)
    client.set("k", b"v")
    assert master.get("k") == b"v"
    del client, master
    gc.collect()
    assert listeners(port) == []  # the store owned the socket and closed it


def test_a_taken_port_is_a_one_line_error():
    port = free_port()
    first = tcp_store("127.0.0.1", port, 1, is_master=True, timeout=_timeout(), wait_for_workers=False)
    try:
        with pytest.raises(OSError, match=rf"^TCPStore: cannot listen on 127\.0\.0\.1:{port}: "):
            tcp_store("127.0.0.1", port, 1, is_master=True, timeout=_timeout(), wait_for_workers=False)
    finally:
        del first
        gc.collect()


def test_weight_transfer_sender_listens_on_its_host_only():
    from memrl.engines.weight_transfer import TransferSpec, WeightTransfer

    spec = TransferSpec("127.0.0.1", free_port(), 1, "gloo")
    sender = WeightTransfer(spec, 0)  # world size 1: the sender alone
    assert listeners(spec.port) == [("tcp", LOOPBACK_HEX)]
    del sender


def test_training_ranks_rendezvous_on_master_addr_only(tmp_path):
    """Two real processes join the default group through distributed.init_group; rank 0 reports what
    its store listens on while both are joined, and an all-reduce across them works."""
    port = free_port()
    script = textwrap.dedent(f"""
        import sys, torch, torch.distributed as dist
        sys.path.insert(0, {str(ROOT)!r})
        from memrl.training.ranks.distributed import DistInfo, init_group, leave_group
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_tcpstore import listeners
        rank = int(sys.argv[1])
        init_group(DistInfo(rank=rank, world_size=2, master_addr="127.0.0.1", master_port={port}))
        seen = listeners({port}) if rank == 0 else None
        x = torch.tensor([rank + 1.0])
        dist.all_reduce(x)
        print("RESULT", rank, float(x), seen, flush=True)
        leave_group()
        assert not dist.is_initialized()
    """)
    path = tmp_path / "rank.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, str(path), str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    results = [line for out, _ in outs for line in out.splitlines() if line.startswith("RESULT")]
    # 1 + 2 = 3 on both ranks; rank 0's store: one listener, on 127.0.0.1
    assert sorted(results) == ["RESULT 0 3.0 [('tcp', '0100007F')]", "RESULT 1 3.0 None"]


def test_leaving_without_a_group_does_nothing():
    import torch

    from memrl.training.ranks.distributed import leave_group

    assert not torch.distributed.is_initialized()
    leave_group()  # the single-process trainer's close: no group, no barrier, no error
    assert not torch.distributed.is_initialized()
