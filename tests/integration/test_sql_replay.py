"""The SQL replay (ClickHouse, chDB) yields exactly the Python replay's signals, byte for byte.

The log is a simulated run roughed up with every edge the rules name: duplicate event ids, rollouts
beyond a full group, rollouts arriving after their step closed, missing rollouts, steps without a
completed-step record or with a wrong trajectory count, invalid scores, and out-of-order steps.
"""
from __future__ import annotations

import json
import math
import random
import uuid

import clickhouse_connect
import pytest

from coevolve.schemas.container import LogWriter
from coevolve.services.simulate import SimulationConfig, Simulator
from coevolve.streams.replay.engine_python import replay_files
from coevolve.streams.replay.engine_sql import replay_sql
from coevolve.streams.replay.report import write_jsonl
from coevolve.streams.replay.sql_stages import file_source
from coevolve.streams.rules import Thresholds

pytestmark = pytest.mark.integration

THRESHOLDS = [Thresholds(), Thresholds(0.3, 3, 10.0, 2), Thresholds(0.7, 8, 2.0, 3), Thresholds(0.5, 1, 40.0, 1)]


def rough_log(cfg: SimulationConfig, seed: int = 7) -> tuple[list[dict], list[dict]]:
    """(trajectories in log order, completed-step records) with the edge cases mixed in."""
    rng = random.Random(seed)
    trajectories, steps = [], []
    for _topic, _key, name, event in Simulator(cfg).events():
        if name == "TrajectoryRecorded":
            trajectories.append(event)
        elif name == "StepCompleted":
            roll = rng.random()
            if roll < 0.05:
                continue  # no completed-step record: the step closes at the end of the input
            if roll < 0.10:
                event = {**event, "trajectory_count": event["trajectory_count"] - rng.randint(1, 20)}
            elif roll < 0.15:
                event = {**event, "trajectory_count": event["trajectory_count"] + rng.randint(1, 20)}
            steps.append(event)
    out: list[dict] = []
    held: list[tuple[int, dict]] = []  # (release position, event): arrives later than it should
    for event in trajectories:
        roll = rng.random()
        while held and held[0][0] <= len(out):
            out.append(held.pop(0)[1])
        if roll < 0.01:
            continue  # lost rollout: its group closes short
        if roll < 0.02:
            event = {**event, "score": math.nan}  # invalid
        elif roll < 0.04:
            held.append((len(out) + rng.randint(1, 3000), event))  # late, or out of order
            held.sort(key=lambda h: h[0])
            continue
        out.append(event)
        if roll > 0.98:
            out.append(dict(event))  # duplicate event id, right away
        elif roll > 0.97:
            held.append((len(out) + rng.randint(1, 2000), dict(event)))  # duplicate, later
            held.sort(key=lambda h: h[0])
        elif roll > 0.965:
            out.append({**event, "event_id": str(uuid.uuid4()), "rollout_index": 0})  # beyond a full group
    out += [e for _, e in held]
    return out, steps


def publish_log(bootstrap: str, trajectories: list[dict], steps: list[dict]) -> None:
    """The completed steps, then the trajectories, on their topics (keyed as the learner keys them)."""
    from coevolve.services.kafka.producer import EventProducer

    with EventProducer(bootstrap) as producer:
        for event in steps:
            producer.send("coevolve.steps", event, key=event["run_id"])
        for event in trajectories:
            producer.send("coevolve.trajectories", event, key=event["task_id"])


@pytest.fixture(scope="module")
def big_log(tmp_path_factory):
    """About 110k trajectory events: 300 steps x 48 tasks x 8 rollouts, roughed up."""
    cfg = SimulationConfig(run_id="rough", steps=300, tasks=60, batch_tasks=48, group_size=8, seed=3)
    trajectories, steps = rough_log(cfg)
    path = tmp_path_factory.mktemp("log") / "run.avro"
    with LogWriter(path) as writer:
        for event in trajectories:
            writer.write("TrajectoryRecorded", event)
        for event in steps:
            writer.write("StepCompleted", event)
    return path, len(trajectories)


def _lines(signals, path) -> list[str]:
    write_jsonl(signals, path)
    return sorted(path.read_text().splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("th", THRESHOLDS[:3], ids=lambda t: "tau{}-W{}-theta{}-n{}".format(*t.key()))
def test_sql_equals_python_on_100k_rough_log(big_log, th, tmp_path):
    path, count = big_log
    assert count >= 100_000
    expected = replay_files([path], th, decoder="fastavro")
    assert expected.outcomes["late"] > 0 and expected.outcomes["duplicate"] > 0 and expected.outcomes["invalid"] > 0
    client = clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        signals, stats = replay_sql(client, file_source([path]), th)
    finally:
        client.close()
    assert stats["events"] == count
    kinds = {s.kind for s in expected.signals}
    assert kinds == {"forgetting", "boundary", "rare"}
    assert any(s.incomplete for s in expected.signals)
    python, sql = _lines(expected.signals, tmp_path / "py.jsonl"), _lines(signals, tmp_path / "sql.jsonl")
    assert len(sql) == len(python)
    assert sql == python  # byte-identical JSON lines, evidence included


@pytest.mark.slow
def test_chdb_decoder_equals_fastavro_decoder_on_100k_rough_log(big_log, tmp_path):
    path, count = big_log
    th = THRESHOLDS[1]
    chdb, fast = (replay_files([path], th, decoder=d) for d in ("chdb", "fastavro"))
    assert chdb.events == fast.events == count
    assert chdb.outcomes == fast.outcomes and chdb.invalid == fast.invalid
    assert _lines(chdb.signals, tmp_path / "c.jsonl") == _lines(fast.signals, tmp_path / "f.jsonl")


def test_sql_equals_python_on_small_rough_log(tmp_path):
    trajectories, steps = rough_log(SimulationConfig(steps=25, tasks=12, batch_tasks=8, group_size=4), seed=11)
    path = tmp_path / "run.avro"
    with LogWriter(path) as writer:
        for event in trajectories:
            writer.write("TrajectoryRecorded", event)
        for event in steps:
            writer.write("StepCompleted", event)
    client = clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        for th in THRESHOLDS:
            expected = replay_files([path], th, decoder="fastavro")
            signals, _ = replay_sql(client, file_source([path]), th)
            got = [json.loads(x) for x in _lines(signals, tmp_path / "s.jsonl")]
            want = [json.loads(x) for x in _lines(expected.signals, tmp_path / "p.jsonl")]
            assert got == want, th
    finally:
        client.close()
