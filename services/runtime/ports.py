"""Ports for listeners that another process binds later (a service's /metrics, the embedded broker).

A port from `bind(("127.0.0.1", 0))` is in the kernel's ephemeral range, the same range every outgoing
connection takes its local port from. Handed to a child that binds it seconds later (after importing
torch, say), it can meanwhile become the local end of some Kafka client's connection: a resumed
`coevolve run` once failed so ("learner: [Errno 98] Address already in use"). Ports are therefore
picked below the ephemeral range, where only explicit listeners live, and never twice by one process.
Candidates come from the OS's randomness, not the `random` module, which a training library reseeds: a
reseeded module replayed the ports already handed out until none of 200 tries was left.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 12_000  # candidates below the ephemeral range
_handed: set[int] = set()
_candidates = random.SystemRandom()


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default, 32768, where it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port on `host` that nothing listens on now, outside the ephemeral range, not handed out before."""
    high = ephemeral_low()
    low = max(1024, high - _SPAN)
    for _ in range(attempts):
        port = _candidates.randrange(low, high)
        if port in _handed:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed.add(port)
        return port
    raise OSError(f"no free port on {host} in {low}-{high - 1} after {attempts} tries; "
                  "free some listeners or widen net.ipv4.ip_local_port_range")
