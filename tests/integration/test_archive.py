"""The archiver through the real broker (Tansu) into the real engine (chDB)."""
from __future__ import annotations

import base64
import json
import shutil
import threading
import time
import urllib.request
import uuid

import pytest

from coevolve.schemas.codec import SCHEMA_DIR, SchemaRegistry
from coevolve.services.archive.archiver import Archiver
from coevolve.services.archive.config import ArchiverConfig
from coevolve.services.clickhouse.client import connect
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.simulate import SimulationConfig, Simulator, publish
from tests.events import sample_events
from tests.integration.archive_helpers import archived_tables, expected_tables, raw_count, read_whole_log

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SMALL = SimulationConfig(steps=3, tasks=10, batch_tasks=4, group_size=4, synthesized_per_step=2)
NOW = 1_795_000_000_000


def _config(bootstrap: str, url: str, **kw) -> ArchiverConfig:
    return ArchiverConfig(kafka_bootstrap=bootstrap, clickhouse_url=url, idle_exit_seconds=1.5,
                          batch_seconds=0.3, group_id=f"archiver-{uuid.uuid4().hex[:6]}", **kw)


def _extra_events() -> list[tuple[str, str, dict]]:
    """What the simulator does not produce: a signal, explorations (signal-guided and random), a verdict
    with its stages, a step with the learner's fields, an evaluation and a dead letter."""
    sample = sample_events()
    thresholds = {"success_threshold": 0.5, "window": 5, "rare_threshold": 5.0, "pattern_length": 1}
    evidence = {"scores": [0.2, 0.9], "attempt_score": 0.55, "previous_scores": [1.0], "pattern_count": 0,
                "pattern_total": 0, "task_ids": ["seed-0001"], "trajectories": [
                    {"event_id": "t1", "task_id": "seed-0001", "rollout_index": 0, "score": 0.2,
                     "actions": [{"name": "mv", "arguments": "{}", "observation": "moved"}]}]}
    return [
        ("coevolve.signals", "SignalRaised", {
            "event_id": "sig-1", "kind": "boundary", "run_id": "sim-run", "step": 1, "subject": "seed-0001",
            "task_id": "seed-0001", "pattern": [], "thresholds": thresholds, "incomplete": False,
            "evidence": evidence, "produced_at": NOW}),
        ("coevolve.explorations", "ExplorationRecorded", {
            "event_id": "exp-1", "run_id": "sim-run", "step": 1, "signal_id": "sig-1", "signal_kind": "boundary",
            "task_id": "seed-0001", "round": 0, "context": "fails to move the file",
            "tuples": [{"name": "mv", "arguments": "{}", "observation": "ok", "task_id": "seed-0001"}],
            "model": "tiny", "produced_at": NOW}),
        ("coevolve.explorations", "ExplorationRecorded", {
            **sample["ExplorationRecorded"], "event_id": "exp-2", "run_id": "sim-run", "signal_id": None,
            "signal_kind": None, "strategy": "random", "signal_ids": []}),
        ("coevolve.tasks", "TaskChecked", {**sample["TaskChecked"], "event_id": "task-1", "run_id": "sim-run"}),
        ("coevolve.steps", "StepCompleted", {**sample["StepCompleted"], "run_id": "learner-run"}),
        ("coevolve.evaluations", "EvaluationCompleted", {**sample["EvaluationCompleted"], "run_id": "sim-run"}),
        ("coevolve.deadletter", "DeadLettered", {
            "event_id": "dl-1", "source_topic": "coevolve.trajectories", "source_partition": 2,
            "source_offset": 9, "key": b"seed-0001", "payload": b"\xc3\x01late", "error_type": "late",
            "reason": "group already closed", "service": "signals", "produced_at": NOW}),
    ]


def _publish_all(bootstrap: str) -> None:
    publish(SMALL, bootstrap)
    with EventProducer(bootstrap) as producer:
        for topic, name, event in _extra_events():
            producer.send(topic, event, key="k", record_name=name)
        producer.send_raw("coevolve.trajectories", b"not avro at all", b"seed-0002", "raw")


def test_every_event_type_lands_with_health_and_metrics(bootstrap, tmp_path):
    _publish_all(bootstrap)
    service = Archiver(_config(bootstrap, f"chdb://{tmp_path}/ch", metrics_port=0))
    thread = threading.Thread(target=service.run)
    thread.start()
    deadline = time.monotonic() + 30
    while service.stored_events == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    port = service.server.server_address[1]
    health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz"))
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    thread.join(60)
    assert not thread.is_alive()
    assert health["status"] == "ok" and health["stored_events"] > 0
    assert 'archiver_rows_total{table="trajectories"}' in metrics

    log = read_whole_log(bootstrap)
    client = connect(f"chdb://{tmp_path}/ch", create=False)
    try:
        archived = archived_tables(client)
        dead = client.query("SELECT source_topic, error_type, reason FROM coevolve.deadletters FINAL").result_rows
        actions = client.query("SELECT count() FROM coevolve.actions FINAL").result_rows[0][0]
        new_fields = {name: client.query(sql).result_rows for name, sql in {
            "strategies": "SELECT strategy, signal_id FROM coevolve.explorations FINAL",
            "stages": "SELECT stage, length(stages), seed_task_id FROM coevolve.tasks FINAL WHERE stage IS NOT NULL",
            "learner": "SELECT pool_size, pool_synthesized, blocked_seconds, tokens_trained FROM coevolve.steps "
                       "FINAL WHERE pool_size IS NOT NULL",
            "evaluations": "SELECT run_id, step, split, success_rate FROM coevolve.evaluations FINAL"}.items()}
    finally:
        client.close()
    assert set(archived) == {"trajectories", "actions", "steps", "signals", "explorations", "tasks", "evaluations",
                             "deadletters"}
    assert archived == expected_tables(log)
    assert {r[0] for r in new_fields["strategies"]} == {"signal-guided", "random"}
    assert new_fields["stages"] == [("executable", 2, "multi_turn_base_7")]
    assert new_fields["learner"] == [(120, 7, 0.001, 9000)]
    assert new_fields["evaluations"] == [("sim-run", 3, "test", 0.5)]
    assert actions == sum(len(d.event["actions"]) for d in log if d.name == "TrajectoryRecorded")
    # the published dead letter, and the one the archiver itself wrote for the undecodable message
    assert ("coevolve.trajectories", "late", "group already closed") in dead
    assert any(e == "malformed" and t == "coevolve.trajectories" and r for t, e, r in dead)


class _CrashAfterInsert(Archiver):
    """Dies between storing a batch and committing its offsets, once."""

    def commit(self, consumer) -> None:
        raise RuntimeError("crash before commit")


def test_redelivered_batch_does_not_double_count(bootstrap, tmp_path):
    url = f"chdb://{tmp_path}/ch"
    publish(SMALL, bootstrap)
    cfg = _config(bootstrap, url)
    with pytest.raises(RuntimeError, match="crash before commit"):
        _CrashAfterInsert(cfg).run()
    Archiver(cfg).run()  # same group: the uncommitted batch is delivered again and re-inserted
    # the same events published a second time (new produced_at): duplicates in the log; the first is kept
    with EventProducer(bootstrap) as producer:
        for topic, key, name, event in Simulator(SMALL).events():
            producer.send(topic, event, key=key, record_name=name)
    Archiver(cfg).run()

    log = read_whole_log(bootstrap)
    trajectories = sum(1 for d in log if d.name == "TrajectoryRecorded")
    client = connect(url, create=False)
    try:
        raw = raw_count(client, "trajectories")
        archived = archived_tables(client)
    finally:
        client.close()
    distinct = len({d.event["event_id"] for d in log if d.name == "TrajectoryRecorded"})
    assert trajectories == 2 * distinct
    assert raw > 2 * distinct  # the crashed batch and the log's duplicates were physically inserted again
    assert archived == expected_tables(log)
    assert len(archived["trajectories"]) == distinct


PROBE = {"type": "record", "name": "ProbeRecorded", "namespace": "coevolve.events",
         "fields": [{"name": "event_id", "type": "string"}, {"name": "note", "type": "string"}]}


def test_an_event_without_a_table_is_dead_lettered_with_the_reason(bootstrap, tmp_path):
    schemas = tmp_path / "schemas"  # the installed schemas plus one the archive has no table for
    schemas.mkdir()
    for path in SCHEMA_DIR.glob("*.avsc"):
        shutil.copy(path, schemas)
    (schemas / "ProbeRecorded.avsc").write_text(json.dumps(PROBE))
    registry = SchemaRegistry(schemas)
    step = sample_events()["StepCompleted"]
    with EventProducer(bootstrap, registry=registry) as producer:
        producer.send("coevolve.steps", {"event_id": "probe-1", "note": "from a newer release"},
                      key="k", record_name="ProbeRecorded")
        producer.send("coevolve.steps", step, key="r1")
    url = f"chdb://{tmp_path}/ch"
    cfg = _config(bootstrap, url)
    first = Archiver(cfg, schemas=registry)
    first.run()
    assert first.consumer.dead_lettered == 1
    second = Archiver(cfg, schemas=registry)  # same group: the probe's offset was committed, not redelivered
    second.run()
    assert second.consumer.dead_lettered == 0

    client = connect(url, create=False)
    try:
        steps = client.query("SELECT event_id FROM coevolve.steps FINAL").result_rows
        dead = client.query("SELECT source_topic, source_offset, error_type, reason, service, payload "
                            "FROM coevolve.deadletters FINAL").result_rows
    finally:
        client.close()
    assert steps == [(step["event_id"],)]  # the event after it was stored
    assert len(dead) == 1
    topic, offset, error_type, reason, service, payload = dead[0]
    assert (topic, offset, error_type, service) == ("coevolve.steps", 0, "unarchivable", "archiver")
    assert "no archive table for ProbeRecorded" in reason
    original = base64.b64decode(payload.removeprefix("base64:"))
    assert registry.decode(original) == ("ProbeRecorded", {"event_id": "probe-1", "note": "from a newer release"})
