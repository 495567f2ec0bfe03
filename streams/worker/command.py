"""`coevolve streams worker`: one Faust worker of the signal processors, until SIGINT/SIGTERM.

A `runtime.Service` whose loop is Faust's: the skeleton serves /healthz and /metrics; Faust's worker
handles the signals, commits offsets of processed events, and stops gracefully.

Health. Every `tick_s` the app sends a tick message to each partition of its counts and markers topics
(app.py), which the `attempts` and `rare` agents handle like any other. /healthz fails when an agent
that holds partitions has handled no tick for `stale_s`: the event loop, the consumer or that agent is
stuck, and the supervisor (run.liveness_s, the k8s liveness probe) restarts the worker.
"""
from __future__ import annotations

import time

import faust
from kafka import KafkaAdminClient

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.kafka.topics import CATALOG, SIGNALS, create_topics
from coevolve.services.runtime.service import Service
from coevolve.streams.worker.app import build_app, internal_topics
from coevolve.streams.worker.config import StreamsConfig
from coevolve.streams.worker.metrics import TICKED, Metrics


class StreamsWorker(Service):
    name = "streams"
    commits = False  # Faust commits the offsets of acknowledged events
    stale_s = 60.0  # seconds an agent holding partitions may go without a tick (one every tick_s)

    def __init__(self, cfg: StreamsConfig):
        super().__init__(cfg)
        self.metrics = Metrics(self.registry)
        self.app: faust.App | None = None
        self.app_started = time.monotonic()
        self.on_log: frozenset[str] = frozenset()
        self.watch(self.stalled)

    def health(self) -> tuple[bool, dict]:
        """Healthy while every agent that holds partitions handles ticks (the loop does not beat `Service`)."""
        failures = self.failures()
        now = time.monotonic()
        ticks = {agent: round(now - at, 3) for agent, at in self.metrics.ticked_at.items()}
        return not failures, {"app_id": self.cfg.app_id, "seconds_since_tick": ticks, "failures": failures}

    def stalled(self) -> str | None:
        """Which agents holding partitions handled no tick for `stale_s` (counted from the app's start)."""
        if self.app is None or not self._assigned():
            return None
        now = time.monotonic()
        late = [a for a in TICKED if now - self.metrics.ticked_at.get(a, self.app_started) > self.stale_s]
        return (f"agent(s) {', '.join(late)} handled no tick for {self.stale_s:.0f} s (one is sent every "
                f"{self.cfg.tick_s} s): the worker's loop or consumer is stuck") if late else None

    def _assigned(self) -> bool:
        """Whether this worker holds partitions (a worker beyond the partition count holds none)."""
        consumer = self.app._consumer  # not `app.consumer`, which would make one here, in the health thread
        try:
            return consumer is not None and bool(consumer.assignment())
        except Exception:  # the consumer is not up yet: not stuck, starting
            return False

    def start(self) -> None:
        """Create the topics the app reads and writes."""
        cfg = self.cfg
        create_topics(cfg.kafka_bootstrap, list(CATALOG.values()) + list(internal_topics(cfg.app_id).values()),
                      replication_factor=cfg.replication_factor)
        cfg.datadir.mkdir(parents=True, exist_ok=True)
        self.on_log = signals_on_log(cfg)
        if self.on_log:
            self.log.info("streams.worker.starting_over", app_id=cfg.app_id, signals_on_log=len(self.on_log))

    def loop(self) -> None:
        cfg = self.cfg
        app = self.app = build_app(cfg, self.metrics, self.on_log)
        self.app_started = time.monotonic()
        self.log.info("streams.worker.starting", app_id=cfg.app_id, bootstrap=cfg.kafka_bootstrap,
                      metrics_port=self.server.server_address[1] if self.server else None,
                      thresholds=cfg.thresholds().as_record())
        faust.Worker(app, loglevel=cfg.log_level, quiet=True).execute_from_commandline()


def signals_on_log(cfg: StreamsConfig) -> frozenset[str]:
    """The ids of the signals on coevolve.signals when this worker's group has committed nothing: a worker
    that starts over a log holding its signals (restored from the archive, `services/archive/restore.py`)
    rebuilds its tables from the start and sends only the signals the log lacks. Empty otherwise."""
    security = KafkaSecurity.from_environment()
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap, client_id=f"{cfg.app_id}-start",
                             request_timeout_ms=10000, **security.kafka_python_options())
    try:
        committed = admin.list_group_offsets(cfg.app_id).get(cfg.app_id, {})
    finally:
        admin.close()
    if any(meta.offset >= 0 for meta in committed.values()):
        return frozenset()
    consumer = EventConsumer(cfg.kafka_bootstrap, [SIGNALS.name], service="streams", security=security)
    try:
        return frozenset(str(item.event["event_id"]) for item in consumer.read_to_end(timeout_s=120.0, complete=True))
    finally:
        consumer.close()


def run_worker(cfg: StreamsConfig) -> None:
    """Run a worker in the foreground until SIGINT/SIGTERM."""
    StreamsWorker(cfg).run()
