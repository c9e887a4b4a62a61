"""torch's TCPStore, hosted on the address it is given.

Given host "127.0.0.1", torch's TCPStore master listens on every interface (it binds the wildcard
address `::`, so also `0.0.0.0`; torch 2.13), which exposes the rendezvous of a local run to the network.
`tcp_store` binds the listening socket itself, to `host`, and hands it to the store
(`master_listen_fd`, supported by both of torch's store backends, libuv and the classic one); clients
connect as before. The store owns the socket from then on and closes it when it is destroyed.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch.distributed as dist


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening: the host's first address family."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise OSError(f"TCPStore: cannot resolve host {host!r}: {e.strerror or e}") from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise OSError(f"TCPStore: cannot listen on {host}:{port}: {e.strerror or e}") from e
    return sock


def tcp_store(host: str, port: int, world_size: int, is_master: bool, timeout: datetime.timedelta,
              wait_for_workers: bool) -> Any:
    """torch.distributed.TCPStore at host:port; the master's listening socket is bound to `host` only."""
    if not is_master:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout,
                             wait_for_workers=wait_for_workers)
    sock = listening_socket(host, port)
    # The store owns the descriptor (its destructor closes it): a Python socket object left to close it
    # kills the store's listener ("Unexpected poll revent on the master's listening socket"). Not closed
    # here on failure either: the store may have closed it already.
    fd = sock.detach()
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout,
                         wait_for_workers=wait_for_workers, master_listen_fd=fd)
