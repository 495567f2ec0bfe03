"""`coevolve replay --bootstrap`: read the topics from offset zero, publish to a topic, diff against one."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coevolve.services.cli import app
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.simulate import SimulationConfig, Simulator
from coevolve.streams.replay.engine_python import replay_signals
from coevolve.streams.replay.report import read_signal_topic
from coevolve.streams.rules import Thresholds

pytestmark = pytest.mark.integration


def test_replay_from_topics_publishes_and_compares(bootstrap, tmp_path):
    events = list(Simulator(SimulationConfig(steps=4, seed=5, synthesized_per_step=1)).events())
    with EventProducer(bootstrap, client_id="test") as producer:
        for topic, key, name, event in events:
            producer.send(topic, event, key=key, record_name=name)
    expected = {s.id for s in replay_signals((n, e) for _, _, n, e in events)}
    runner = CliRunner()
    out = tmp_path / "signals.jsonl"
    res = runner.invoke(app, ["replay", "--bootstrap", bootstrap, "--output", str(out), "--publish", "replayed"])
    assert res.exit_code == 0, res.output
    assert {json.loads(line)["id"] for line in out.read_text().splitlines()} == expected
    assert {s["id"] for s in read_signal_topic(bootstrap, "replayed")} == expected
    res = runner.invoke(app, ["replay", "--bootstrap", bootstrap, "--rare-threshold", "1", "--compare", "replayed"])
    assert res.exit_code == 0, res.output
    key = lambda s: (s.kind, s.run_id, s.step, s.subject)  # noqa: E731
    old = {key(s) for s in replay_signals((n, e) for _, _, n, e in events)}
    new = {key(s) for s in replay_signals(((n, e) for _, _, n, e in events), Thresholds(rare_threshold=1))}
    assert old - new and not new - old
    assert f"compared with {len(expected)} signals: +0 -{len(old - new)}" in res.output
