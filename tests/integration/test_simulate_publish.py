"""`coevolve simulate` publishes a run to the real broker, at the rate asked for."""
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from coevolve.services.cli import app
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.topics import CATALOG
from coevolve.services.simulate import SimulationConfig, Simulator

pytestmark = pytest.mark.integration


def test_simulate_publishes_the_whole_stream_keyed_as_the_catalog_says(bootstrap):
    args = ["simulate", "--bootstrap", bootstrap, "--steps", "3", "--tasks", "10", "--batch-tasks", "4",
            "-k", "4", "--synthesized-per-step", "2", "--seed", "9"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "TrajectoryRecorded=48" in result.output and "StepCompleted=3" in result.output

    consumer = EventConsumer(bootstrap, list(CATALOG), service="test")
    try:
        items = consumer.drain(idle_s=1.0)
    finally:
        consumer.close()
    assert Counter(i.topic for i in items) == {"coevolve.trajectories": 48, "coevolve.steps": 3,
                                               "coevolve.tasks": 6}
    for item in items:
        expected_key = item.event["run_id"] if item.topic == "coevolve.steps" else item.event["task_id"]
        assert item.key == expected_key.encode()
    cfg = SimulationConfig(steps=3, tasks=10, batch_tasks=4, group_size=4, synthesized_per_step=2, seed=9)
    assert sorted(i.event["event_id"] for i in items) == sorted(e["event_id"] for *_, e in Simulator(cfg).events())


def test_rate_limits_publishing(bootstrap):
    args = ["simulate", "--bootstrap", bootstrap, "--steps", "2", "--tasks", "5", "--batch-tasks", "5",
            "-k", "4", "--synthesized-per-step", "0", "--rate", "100"]
    started = time.monotonic()
    result = CliRunner().invoke(app, args)
    elapsed = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert elapsed >= 42 / 100 * 0.9  # 42 events at 100/s cannot finish much sooner
