"""The TCPStores this project hosts (the ranks' store, the weight transfer's rendezvous) listen on the
address their clients dial, not on every interface as torch's own server does: a store on 127.0.0.1 is
reachable from this host only, and one on a pod's address from the pod network only."""
from __future__ import annotations

import datetime
import socket
from typing import Any

from coevolve.services.runtime.log import get_logger

log = get_logger("stores")


def _listening(address: str, port: int) -> socket.socket | None:
    """A socket bound to `address`:`port` and listening, or None when `address` is no address of this host."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(socket.SOMAXCONN)
        return sock
    except OSError as exc:
        sock.close()
        if exc.errno == 98:  # EADDRINUSE: the port is taken, which the caller must hear
            raise
        return None


def hosted_store(address: str, port: int, world_size: int | None, timeout: datetime.timedelta, **options: Any) -> Any:
    """A `torch.distributed.TCPStore` master at `address`:`port`, listening on that address alone; where it is
    not an address of this host (behind a NAT), on every interface, with a warning."""
    import torch.distributed as dist

    sock = _listening(address, port)
    if sock is None:
        log.warning("stores.every_interface", address=address, port=port,
                    why=f"{address} is not an address of this host; the NetworkPolicies are the guard")
        return dist.TCPStore(address, port, world_size, is_master=True, timeout=timeout, **options)
    return dist.TCPStore(address, sock.getsockname()[1], world_size, is_master=True, timeout=timeout,
                         master_listen_fd=sock.detach(), **options)
