"""Which tool host a workspace's calls run in: within a service's scope (`bounded_tool_calls`), each thread
that opens workspaces gets a host of its own (`host.py`).

A host runs one request at a time, so one host per process would let a call stalled in one thread (the
learner's look-ahead rollouts) hold every other thread's episodes (its evaluation) for up to
`call_limit_s`. A workspace stays with the host that opened it, whichever thread calls it later.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from coevolve.services.envs.host import ToolHost


class ToolHosts:
    """One `ToolHost` per calling thread, started with the thread's first workspace; counts summed."""

    def __init__(self, limit_s: float, memory_mb: int):
        self.limit_s, self.memory_mb = limit_s, memory_mb
        self._local = threading.local()
        self._lock = threading.Lock()
        self.hosts: list[ToolHost] = []

    def current(self) -> ToolHost:
        host = getattr(self._local, "host", None)
        if host is None:
            host = self._local.host = ToolHost(self.limit_s, self.memory_mb)
            with self._lock:
                self.hosts.append(host)
        return host

    def count(self, attribute: str) -> int:
        with self._lock:
            return sum(getattr(host, attribute) for host in self.hosts)

    def close(self) -> None:
        with self._lock:
            for host in self.hosts:
                host.close()


_installed: ToolHosts | None = None


@contextmanager
def bounded_tool_calls(limits: Any = None) -> Iterator[ToolHost | None]:
    """Within, this process's new workspaces run their calls in tool hosts bounded by `limits` (its
    `call_limit_s` and `call_memory_mb`; None or a limit of 0: here, unbounded). Yields the calling
    thread's host."""
    global _installed
    bounded = limits is not None and limits.call_limit_s > 0
    previous, _installed = _installed, ToolHosts(limits.call_limit_s, limits.call_memory_mb) if bounded else None
    try:
        yield _installed.current() if _installed is not None else None
    finally:
        if _installed is not None:
            _installed.close()
        _installed = previous


def installed() -> ToolHost | None:
    """The calling thread's tool host, or None when this process runs calls in-process."""
    return _installed.current() if _installed is not None else None


class _Counts(Collector):
    """This process's tool hosts on a service's /metrics, read at each scrape (zero while none is installed)."""

    COUNTS = (("tool_host_calls_stopped", "Tool calls stopped at their time limit (limits.call_limit_s); each had "
                                          "no effect.", "stopped"),
              ("tool_host_restarts", "Tool hosts started anew after a call past its limit or a host's death.",
               "restarts"),
              ("tool_host_workspaces_lost", "Open workspaces a new tool host could not rebuild (their episodes "
                                            "ended).", "lost"))

    def collect(self) -> Iterator[Metric]:
        for name, text, attribute in self.COUNTS:
            yield CounterMetricFamily(name, text, value=_installed.count(attribute) if _installed else 0)


def register_tool_host(registry: CollectorRegistry) -> None:
    """Expose the tool hosts' counts on `registry` (a service's)."""
    registry.register(_Counts())
