"""The TCPStores this project hosts (the ranks' store, the weight transfer's rendezvous) listen on the
address their clients dial, not on every interface as torch's own server does: a store on 127.0.0.1 is
reachable from this host only, and one on a pod's address from the pod network only. The gloo groups
formed over them listen where the store is reached too (`gloo_address`), not at whatever the host name
resolves to, which in a container or a cloud VM is an address beyond loopback."""
from __future__ import annotations

import datetime
import fcntl
import socket
import struct
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


def gloo_address(store: str, hosting: bool) -> str:
    """The address a rank's gloo connections listen on: the store's own on the rank hosting it (when it is
    an address of this host), else this host's address on the route to the store."""
    family, _, _, _, where = socket.getaddrinfo(store, 9, type=socket.SOCK_DGRAM)[0]
    if hosting:
        sock = _listening(store, 0)
        if sock is not None:
            sock.close()
            return where[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(where)  # a UDP connect sends nothing: it picks the route
        return probe.getsockname()[0]


def gloo_options(store: str, hosting: bool, timeout: datetime.timedelta) -> Any:
    """Options of a gloo group (`ProcessGroupGloo(store, rank, size, options)`) listening at `gloo_address`."""
    import torch.distributed as dist

    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=gloo_address(store, hosting))]
    options._timeout = timeout
    return options


def gloo_interface(store: str, hosting: bool) -> str | None:
    """The network interface holding `gloo_address` (for GLOO_SOCKET_IFNAME, where torch forms the group
    itself); None when none is found."""
    address = gloo_address(store, hosting)
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                found = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue
        if socket.inet_ntoa(found[20:24]) == address:
            return name
    return None
