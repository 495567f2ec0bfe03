"""`coevolve streams worker`: one Faust worker of the signal processors, until SIGINT/SIGTERM."""
from __future__ import annotations

import faust

from coevolve.services.broker.topics import CATALOG, create_topics
from coevolve.services.log import get_logger
from coevolve.streams.app import build_app, internal_topics
from coevolve.streams.config import StreamsConfig
from coevolve.streams.metrics import Metrics

log = get_logger("streams")


def run_worker(cfg: StreamsConfig) -> None:
    """Create the topics the app reads and writes, then run a worker in the foreground."""
    create_topics(cfg.kafka_bootstrap, list(CATALOG.values()) + list(internal_topics(cfg.app_id).values()))
    cfg.datadir.mkdir(parents=True, exist_ok=True)
    app = build_app(cfg, Metrics())
    log.info("streams.worker.starting", app_id=cfg.app_id, bootstrap=cfg.kafka_bootstrap,
             metrics_port=cfg.metrics_port if cfg.metrics_port >= 0 else None, thresholds=cfg.thresholds().as_record())
    faust.Worker(app, loglevel=cfg.log_level, quiet=True).execute_from_commandline()
