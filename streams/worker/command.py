"""`coevolve streams worker`: one Faust worker of the signal processors, until SIGINT/SIGTERM.

A `runtime.Service` whose loop is Faust's: the skeleton serves /healthz and /metrics; Faust's worker
handles the signals, commits offsets of processed events, and stops gracefully.
"""
from __future__ import annotations

import faust

from coevolve.services.kafka.topics import CATALOG, create_topics
from coevolve.services.runtime.service import Service
from coevolve.streams.worker.app import build_app, internal_topics
from coevolve.streams.worker.config import StreamsConfig
from coevolve.streams.worker.metrics import Metrics


class StreamsWorker(Service):
    name = "streams"
    commits = False  # Faust commits the offsets of acknowledged events

    def __init__(self, cfg: StreamsConfig):
        super().__init__(cfg)
        self.metrics = Metrics(self.registry)

    def health(self) -> tuple[bool, dict]:
        return True, {"app_id": self.cfg.app_id}  # Faust restarts what it runs; the page answers while it runs

    def start(self) -> None:
        """Create the topics the app reads and writes."""
        cfg = self.cfg
        create_topics(cfg.kafka_bootstrap, list(CATALOG.values()) + list(internal_topics(cfg.app_id).values()),
                      replication_factor=cfg.replication_factor)
        cfg.datadir.mkdir(parents=True, exist_ok=True)

    def loop(self) -> None:
        cfg = self.cfg
        app = build_app(cfg, self.metrics)
        self.log.info("streams.worker.starting", app_id=cfg.app_id, bootstrap=cfg.kafka_bootstrap,
                      metrics_port=self.server.server_address[1] if self.server else None,
                      thresholds=cfg.thresholds().as_record())
        faust.Worker(app, loglevel=cfg.log_level, quiet=True).execute_from_commandline()


def run_worker(cfg: StreamsConfig) -> None:
    """Run a worker in the foreground until SIGINT/SIGTERM."""
    StreamsWorker(cfg).run()
