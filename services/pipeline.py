"""`coevolve check`: the data plane on a simulated workload, every part on this machine.

The simulator publishes a run's trajectories, completed steps and task verdicts to the broker. A Faust
signal worker raises signals live; the check compares them with `coevolve replay` of the same log, then
archives everything into chDB and writes the report.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.embedded import broker_for
from coevolve.services.kafka.topics import CATALOG, SIGNALS, create_topics
from coevolve.services.runtime.log import get_logger
from coevolve.services.runtime.ports import free_port
from coevolve.services.simulate import SimulationConfig, publish

log = get_logger("run")


@dataclass
class RunSummary:
    events: dict[str, int]
    live_signals: int
    replay_signals: int
    missing: list[str]
    unexpected: list[str]

    @property
    def signals_agree(self) -> bool:
        return not self.missing and not self.unexpected


@contextlib.contextmanager
def signal_worker(bootstrap: str, workdir: Path):
    """Run one `coevolve streams worker` process for the block; yield its health URL."""
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("coevolve")), "streams", "worker", "--bootstrap", bootstrap,
           "--datadir", str(workdir / "streams"), "--metrics-port", str(port)]
    with open(workdir / "streams-worker.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}/healthz"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for_signals(bootstrap: str, expected: set[str], timeout_s: float) -> set[str]:
    """Collect signal ids from coevolve.signals until every expected one arrived, or the timeout."""
    consumer = EventConsumer(bootstrap, [SIGNALS.name], service="run")
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while not expected <= seen and time.monotonic() < deadline:
            seen.update(d.event["event_id"] for d in consumer.poll(0.5) if d.name == "SignalRaised")
        seen.update(d.event["event_id"] for d in consumer.drain(idle_s=1.0) if d.name == "SignalRaised")
    finally:
        consumer.close()
    return seen


def run_pipeline(workdir: Path, steps: int, bootstrap: str | None = None,
                 signal_timeout_s: float = 180.0) -> RunSummary:
    """Run the data plane on a simulated workload and check live signals against replay."""
    from coevolve.services.analytics.report import archive_and_analyze
    from coevolve.streams.replay.engine_python import replay_topics

    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    with broker_for(bootstrap) as address:
        print(f"bootstrap: {address}", flush=True)
        create_topics(address)
        with signal_worker(address, workdir) as health:
            print(f"signal worker: {health}", flush=True)
            published = publish(SimulationConfig(steps=steps), address)
            log.info("run.published", **published)
            expected = {s.id for s in replay_topics(address).signals}
            live = wait_for_signals(address, expected, signal_timeout_s)
        consumer = EventConsumer(address, list(CATALOG), service="run")
        try:
            seen = Counter(item.topic for item in consumer.drain(idle_s=1.0))
        finally:
            consumer.close()
        archive_and_analyze(address, workdir)
    summary = RunSummary(dict(seen), len(live), len(expected), sorted(expected - live), sorted(live - expected))
    for topic in CATALOG:
        print(f"{topic:24s} {seen.get(topic, 0):8d} events")
    verdict = "equal" if summary.signals_agree else \
        f"DIFFER (missing {len(summary.missing)}, unexpected {len(summary.unexpected)})"
    print(f"signals: live {summary.live_signals}, replay {summary.replay_signals}: {verdict}")
    return summary
