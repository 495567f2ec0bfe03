"""One skeleton for every long-running service: config, logs, /healthz and /metrics, a run loop that
stops gracefully on SIGTERM/SIGINT, and offsets committed only after the work is stored or published.

    @dataclass(frozen=True)
    class EchoConfig(ServiceConfig):         # the broker and /healthz, /metrics fields come with it;
        topic: str = doc("coevolve.signals", "What it reads.")  # `runtime.config.load` layers env vars

    class Echo(Service):
        name = "echo"                        # logs "echo.started", metrics echo_events_total, ...

        def start(self):                     # open clients once the health server is up
            self.consumer = EventConsumer(self.cfg.kafka_bootstrap, [self.cfg.topic], group_id="echo")

        def poll(self):                      # one pass; return when there is nothing to do
            items = self.consumer.poll(0.2)
            self.beat()                      # /healthz turns 503 after `stale_s` without a beat
            self.settle(lambda: publish(items), self.consumer.commit, len(items))

        def finish(self):                    # after stop(): flush what is left, close clients
            self.consumer.close()

    Echo(cfg).serve_until_signalled()        # or .run() where the caller owns the signals

`settle(work, commit, n)` runs the work (store or publish, confirmed), then commits: a crash between
the two re-delivers the batch, which the work must absorb idempotently (by event_id), so nothing is
lost and nothing counts twice. Services whose loop is not theirs (the Faust worker) override `loop()`.
"""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from prometheus_client import CollectorRegistry, Counter, Gauge

from coevolve.services.runtime.health import serve
from coevolve.services.runtime.log import get_logger


class Service:
    """Subclass with a `name`, and `poll()` (or `loop()`); `run()` blocks until `stop()`."""

    name = "service"
    stale_s = 30.0  # /healthz answers 503 when the loop has not beaten for this long
    commits = True  # whether it commits through `settle` (metrics <name>_events, <name>_last_commit_...)

    def __init__(self, cfg, metrics_host: str | None = None, metrics_port: int | None = None,
                 scope: AbstractContextManager | None = None):
        self.cfg = cfg
        self.scope = scope or nullcontext()  # what start and the loop run within (the tool host of its episodes)
        self.metrics_host = metrics_host if metrics_host is not None else getattr(cfg, "metrics_host", "127.0.0.1")
        self.metrics_port = metrics_port if metrics_port is not None else getattr(cfg, "metrics_port", -1)
        self.log = get_logger(self.name)
        self.registry = CollectorRegistry()
        self.committed_events = 0
        if self.commits:
            self.m_events = Counter(f"{self.name}_events", "Events whose work is stored or published and whose "
                                    "offsets are committed.", registry=self.registry)
            self.m_commit = Gauge(f"{self.name}_last_commit_timestamp_seconds", "Unix time of the last offset "
                                  "commit.", registry=self.registry)
        self.last_beat = time.monotonic()
        self.ready = False
        self.server = None
        self._stop = threading.Event()
        self._watched: list[Callable[[], str | None]] = []

    # -- the parts a service fills in --
    def start(self) -> None:
        """Open clients; called once the health server runs."""

    def poll(self) -> None:
        """Do one round of work (a poll and what follows); called until stopped."""
        raise NotImplementedError

    def finish(self) -> None:
        """Flush and close; called once after the loop, also after an error."""

    def details(self) -> dict:
        """Extra fields of /healthz."""
        return {}

    # -- the skeleton --
    def loop(self) -> None:
        while not self._stop.is_set():
            self.poll()

    def run(self) -> int:
        """Serve health and metrics, start, loop until stopped, finish; return the committed events."""
        if self.metrics_port >= 0:
            self.server = serve(self.metrics_port, self.registry, self.health, self.metrics_host)
            self.log.info(f"{self.name}.serving", port=self.server.server_address[1])
        try:
            with self.scope:
                try:
                    self.start()
                    self.ready = True
                    self.loop()
                finally:
                    self.finish()
        finally:
            if self.server is not None:
                self.server.shutdown()
        self.log.info(f"{self.name}.stopped", committed_events=self.committed_events)
        return self.committed_events

    def serve_until_signalled(self) -> int:
        """`run()` with SIGTERM and SIGINT calling `stop()` (main thread only)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        return self.run()

    def stop(self) -> None:
        """End the loop after the current poll; `finish()` still runs."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def beat(self) -> None:
        """Mark the loop alive (call once per poll)."""
        self.last_beat = time.monotonic()

    def watch(self, check: Callable[[], str | None]) -> None:
        """Make `check` part of /healthz: a reason it returns (a background thread died) makes the service
        unhealthy although its loop beats, so a supervisor restarts it."""
        self._watched.append(check)

    def failures(self) -> list[str]:
        """The reasons the watched checks give now (`watch`)."""
        return [why for why in (check() for check in self._watched) if why]

    def health(self) -> tuple[bool, dict]:
        age = time.monotonic() - self.last_beat
        failures = self.failures()
        return age < self.stale_s and not failures, {**self.details(), "ready": self.ready,
                                                      "seconds_since_poll": round(age, 3), "failures": failures}

    def settle(self, work: Callable[[], object], commit: Callable[[], object], events: int) -> None:
        """Run `work` (store or publish, confirmed), then `commit` the offsets it covers: a failure in
        `work` leaves them uncommitted, so the events come again. A commit that returns False (the group
        moved on) is not counted: its events come again, to this member or another."""
        work()
        if commit() is False:
            return
        self.m_commit.set(time.time())
        self.committed_events += events
        self.m_events.inc(events)
