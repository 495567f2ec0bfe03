"""The signal worker's /healthz tells the truth: it fails when an agent holding partitions has handled no
tick message for `stale_s`, and holds while ticks come, before the consumer is up, and on a worker that
holds no partition."""
import time

from coevolve.streams.worker.command import StreamsWorker
from coevolve.streams.worker.config import StreamsConfig


class Consumer:
    def __init__(self, assigned):
        self.assigned = assigned

    def assignment(self):
        if self.assigned is None:
            raise RuntimeError("not started")
        return self.assigned


class App:
    def __init__(self, assigned):
        self._consumer = Consumer(assigned)


def worker(assigned, started_ago: float) -> StreamsWorker:
    w = StreamsWorker(StreamsConfig())
    w.app, w.app_started = App(assigned), time.monotonic() - started_ago
    return w


def test_agents_that_tick_keep_the_worker_healthy_and_one_that_stops_fails_it():
    w = worker({("coevolve.trajectories", 0)}, started_ago=600)
    w.metrics.ticked("attempts")
    w.metrics.ticked("rare")
    ok, details = w.health()
    assert ok and details["failures"] == [] and set(details["seconds_since_tick"]) == {"attempts", "rare"}
    w.metrics.ticked_at["rare"] -= w.stale_s + 1  # the rare agent's last tick is older than the allowance
    ok, details = w.health()
    assert not ok and details["failures"] == [f"agent(s) rare handled no tick for {w.stale_s:.0f} s (one is sent "
                                              "every 1.0 s): the worker's loop or consumer is stuck"]


def test_an_app_that_never_ticked_fails_after_the_allowance_from_its_start():
    assert worker({("coevolve.trajectories", 0)}, started_ago=1).health()[0]
    ok, details = worker({("coevolve.trajectories", 0)}, started_ago=61).health()
    assert not ok and "attempts, rare" in details["failures"][0]


def test_a_worker_without_partitions_or_not_yet_consuming_is_not_stuck():
    assert worker(set(), started_ago=600).health()[0]  # more workers than partitions
    assert worker(None, started_ago=600).health()[0]  # the consumer is still starting
    unmade = worker(set(), started_ago=600)
    unmade.app._consumer = None  # Faust has not made its consumer yet: the probe must not make one
    assert unmade.health()[0] and unmade.app._consumer is None
