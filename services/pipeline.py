"""`coevolve run`: the loop on the embedded default, every part on this machine.

Until the learner lands, the simulator stands in for it: it publishes a run's trajectories, completed
steps and task verdicts to the broker, and the data plane consumes them.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

from coevolve.services.broker.consumer import EventConsumer
from coevolve.services.broker.embedded import EmbeddedBroker
from coevolve.services.broker.topics import CATALOG, create_topics
from coevolve.services.log import get_logger
from coevolve.services.simulate import SimulationConfig, publish

log = get_logger("run")


@contextlib.contextmanager
def broker_for(bootstrap: str | None):
    """Use the given broker, or start the embedded one for the block."""
    if bootstrap:
        yield bootstrap
        return
    with EmbeddedBroker() as embedded:
        yield embedded.bootstrap


def run_pipeline(workdir: Path, steps: int, bootstrap: str | None = None) -> dict[str, int]:
    """Run the data plane on a simulated workload; return events seen per topic."""
    workdir.mkdir(parents=True, exist_ok=True)
    with broker_for(bootstrap) as address:
        print(f"bootstrap: {address}", flush=True)
        create_topics(address)
        published = publish(SimulationConfig(steps=steps), address)
        log.info("run.published", **published)
        consumer = EventConsumer(address, list(CATALOG), service="run")
        try:
            seen = Counter(item.topic for item in consumer.drain(idle_s=1.0))
        finally:
            consumer.close()
        from coevolve.services.archive.report import archive_and_analyze

        archive_and_analyze(address, workdir)
    for topic in CATALOG:
        print(f"{topic:24s} {seen.get(topic, 0):8d} events")
    return dict(seen)
