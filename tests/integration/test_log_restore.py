"""The embedded log's durable copy: the archiver keeps every record and the groups' positions, and a
broker that lost them (SIGKILL) gets them back, each record at its offset, through the real broker
(Tansu) and the real engine (chDB)."""
from __future__ import annotations

import signal
import threading
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from coevolve.services.archive.archiver import Archiver
from coevolve.services.archive.config import ArchiverConfig
from coevolve.services.archive.restore import RestoreError, restore_log
from coevolve.services.clickhouse.client import connect
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import CATALOG, TRAJECTORIES, Topic, create_topics
from coevolve.services.simulate import SimulationConfig, publish

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SMALL = SimulationConfig(steps=3, tasks=10, batch_tasks=4, group_size=4, synthesized_per_step=2)


def _whole_log(bootstrap: str) -> dict:
    """(topic, partition, offset) -> (key, value, timestamp, headers) of every catalog record."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(t, p) for t in CATALOG for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not parts:
            return {}
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        out, quiet = {}, time.monotonic()
        while time.monotonic() - quiet < 1.5:
            for records in consumer.poll(200).values():
                quiet = time.monotonic()
                for r in records:
                    out[(r.topic, r.partition, r.offset)] = (r.key, r.value, r.timestamp, list(r.headers))
        return out
    finally:
        consumer.close()


def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.alter_group_offsets(group, {TopicPartition(t, p): OffsetAndMetadata(o, "", -1)
                                          for (t, p), o in offsets.items()})
    finally:
        admin.close()


def _positions(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.list_group_offsets(group).get(group, {})
        return {(tp.topic, tp.partition): m.offset for tp, m in found.items() if m.offset >= 0}
    finally:
        admin.close()


def _archive(bootstrap: str, url: str, group: str) -> Archiver:
    """Archive everything on the broker, then stop once idle."""
    service = Archiver(ArchiverConfig(kafka_bootstrap=bootstrap, clickhouse_url=url, batch_seconds=0.3,
                                      idle_exit_seconds=2.0, group_id=group, log_id="run-a", positions_s=0.2))
    thread = threading.Thread(target=service.run)
    thread.start()
    thread.join(90)
    assert not thread.is_alive(), "the archiver did not go idle within 90 s"
    return service


def test_a_killed_brokers_log_comes_back_at_its_offsets_with_the_groups_positions(tmp_path):
    url = f"chdb://{tmp_path}/ch"
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        publish(SMALL, broker.bootstrap)
        with EventProducer(broker.bootstrap) as producer:  # undecodable: kept too, or its offset would be a hole
            producer.send_raw(TRAJECTORIES.name, b"not avro at all", b"seed-0002", "raw")
        raw = KafkaProducer(bootstrap_servers=broker.bootstrap)
        raw.send("coevolve.steps", b"\x00headers", key=None, partition=0, headers=[("origin", b"\xff\x00")]).get(10)
        raw.close()
        on_broker = _whole_log(broker.bootstrap)
        some = sorted(k for k in on_broker if k[0] in ("coevolve.signals", TRAJECTORIES.name))[:3]
        _commit(broker.bootstrap, "explorer-group", {(t, p): o + 1 for t, p, o in some})
        create_topics(broker.bootstrap, [Topic("worker-step-counts", "json", "step", 1)])
        _commit(broker.bootstrap, "worker-group", {(TRAJECTORIES.name, 0): 2, ("worker-step-counts", 0): 5})
        archiver = _archive(broker.bootstrap, url, "archiver-group")
        before = _whole_log(broker.bootstrap)  # with the dead letters the archiver wrote for the two records
        assert len(before) == len(on_broker) + 2 and archiver.stored_events >= len(on_broker)
        broker.process.send_signal(signal.SIGKILL)
        broker.process.wait()
        broker.start()  # the same address, memory only: empty
        assert _whole_log(broker.bootstrap) == {}

        client = connect(url)
        try:
            done = restore_log(client, "coevolve", "run-a", broker.bootstrap, archiver_group="archiver-group")
            assert _whole_log(broker.bootstrap) == before  # bytes, keys, headers, timestamps, offsets
            assert done.total == len(before)
            assert _positions(broker.bootstrap, "explorer-group") == {(t, p): o + 1 for t, p, o in some}
            assert done.started_over == ["worker-group"]  # its own topics are not kept: it reads from the start
            assert _positions(broker.bootstrap, "worker-group") == {}
            ends = {}
            for t, p, o in before:
                ends[(t, p)] = max(ends.get((t, p), 0), o + 1)
            assert _positions(broker.bootstrap, "archiver-group") == ends
            with pytest.raises(RestoreError, match="already holds records"):
                restore_log(client, "coevolve", "run-a", broker.bootstrap)
            with pytest.raises(RestoreError, match="keeps no log named 'run-b'.*run-a"):
                restore_log(client, "coevolve", "run-b", broker.bootstrap)
            with EmbeddedBroker() as other:  # a client made coevolve.steps before the restore, with 4 partitions
                create_topics(other.bootstrap, [Topic("coevolve.steps", "StepCompleted", "run_id", 4)])
                with pytest.raises(RestoreError, match=r"coevolve.steps \(4, not 1\) partitions"):
                    restore_log(client, "coevolve", "run-a", other.bootstrap)
            client.command("ALTER TABLE coevolve.log DELETE WHERE topic = 'coevolve.steps' AND offset = 0 "
                           "SETTINGS mutations_sync = 1")
            with pytest.raises(RestoreError, match=r"holes in coevolve.steps:0 \(\d+ records, offsets 1\.\."):
                restore_log(client, "coevolve", "run-a", broker.bootstrap)
        finally:
            client.close()
