"""`coevolve replay --engine sql --no-evidence`: ClickHouse hashes and formats the JSON lines itself.

The bytes must equal the Python replay's own lines (sorted by run, step, kind, subject); a string that
JSON must escape sends the whole set through Python's formatting instead.
"""
from __future__ import annotations

import json

import clickhouse_connect
import pytest

from coevolve.schemas.container import LogWriter
from coevolve.services.simulate import SimulationConfig
from coevolve.streams.replay.command import run_replay
from coevolve.streams.replay.config import ReplayConfig
from coevolve.streams.replay.engine_python import replay_files
from coevolve.streams.replay.sql_lines import replay_sql_lines
from coevolve.streams.replay.sql_stages import file_source
from coevolve.streams.rules import Thresholds
from tests.integration.test_sql_replay import THRESHOLDS, rough_log

pytestmark = pytest.mark.integration


def write_log(path, trajectories, steps):
    with LogWriter(path) as writer:
        for event in trajectories:
            writer.write("TrajectoryRecorded", event)
        for event in steps:
            writer.write("StepCompleted", event)
    return path


def python_lines(path, th: Thresholds) -> bytes:
    signals = sorted(replay_files([path], th, decoder="fastavro").signals, key=lambda s: (s.run_id, s.step, s.kind, s.subject))
    return b"".join(json.dumps(s.to_json(evidence=False), separators=(",", ":")).encode() + b"\n" for s in signals)


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    trajectories, steps = rough_log(SimulationConfig(steps=30, tasks=16, batch_tasks=10, group_size=6), seed=13)
    return write_log(tmp_path_factory.mktemp("log") / "run.avro", trajectories, steps)


@pytest.mark.parametrize("th", THRESHOLDS, ids=lambda t: "tau{}-W{}-theta{}-n{}".format(*t.key()))
def test_clickhouse_formatted_lines_equal_the_python_replay(log, th, tmp_path):
    client = clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        stats = replay_sql_lines(client, file_source([log]), th, tmp_path / "local.jsonl", local=True)
        replay_sql_lines(client, file_source([log]), th, tmp_path / "fetched.jsonl", local=False)
    finally:
        client.close()
    assert "formatted_by" not in stats
    if th.success_threshold != 0.7:  # under (0.7, W 8) SQL settles every attempt of this log
        assert stats["unsettled"] > 0, "the rough log closes attempts out of order: the exact path runs too"
    expected = python_lines(log, th)
    assert expected.count(b"\n") > 50
    assert (tmp_path / "local.jsonl").read_bytes() == expected
    assert (tmp_path / "fetched.jsonl").read_bytes() == expected
    kinds = [json.loads(line)["type"] for line in expected.splitlines()]
    assert stats["counts"] == {k: kinds.count(k) for k in ("forgetting", "boundary", "rare")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fetched.jsonl", "local.jsonl"], "no partial file left"


def test_a_string_json_must_escape_falls_back_to_python_formatting(tmp_path):
    trajectories, steps = rough_log(SimulationConfig(steps=12, tasks=8, batch_tasks=6, group_size=4), seed=2)
    first_task, rare_name = trajectories[0]["task_id"], trajectories[0]["actions"][0]["name"]
    for event in trajectories:
        if event["task_id"] == first_task:
            event["task_id"] = 'tâsk "quoted" \\ one'
        for action in event["actions"]:
            if action["name"] == rare_name:
                action["name"] = "naïve"
    path = write_log(tmp_path / "run.avro", trajectories, steps)
    client = clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        stats = replay_sql_lines(client, file_source([path]), Thresholds(rare_threshold=30.0), tmp_path / "s.jsonl",
                                 local=True)
    finally:
        client.close()
    body = (tmp_path / "s.jsonl").read_bytes()
    assert stats["formatted_by"] == "python"
    assert body == python_lines(path, Thresholds(rare_threshold=30.0))
    assert b'\\u00e2sk \\"quoted\\" \\\\ one' in body


def test_the_command_writes_the_lines_and_counts_them(log, tmp_path):
    out = tmp_path / "signals.jsonl"
    text = run_replay(ReplayConfig(inputs=(log,), engine="sql", output=out, evidence=False))
    expected = python_lines(log, Thresholds())
    assert out.read_bytes() == expected
    kinds = [json.loads(line)["type"] for line in expected.splitlines()]
    assert f"total={len(kinds)}" in text
    for kind in ("forgetting", "boundary", "rare"):
        assert f"{kind}={kinds.count(kind)}" in text
