"""Against the real embedded broker: topics, round trips, typed decode errors, delivery failures."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from coevolve.schemas import EVENTS, default_registry
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.runtime.ports import free_port
from coevolve.services.kafka.offsets import true_end_offsets
from coevolve.services.kafka.producer import DeliveryError, EventProducer
from coevolve.services.kafka.topics import CATALOG, DEADLETTER, SIGNALS, STEPS, WRITES, NotWritable, create_topics
from tests.events import sample_events

pytestmark = pytest.mark.integration

TOPIC_OF = {topic.event: name for name, topic in CATALOG.items()}


def test_create_topics_is_idempotent(broker):
    first = create_topics(broker.bootstrap)
    assert sorted(first) == sorted(CATALOG)
    assert create_topics(broker.bootstrap) == []
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(list(CATALOG))}
    finally:
        admin.close()
    assert described == {name: topic.partitions for name, topic in CATALOG.items()}


def test_catalog_compacts_tasks_and_keeps_trajectories_forever():
    assert CATALOG["coevolve.tasks"].configs["cleanup.policy"] == "compact"
    assert CATALOG["coevolve.trajectories"].configs["retention.ms"] == "-1"
    assert set(TOPIC_OF) == set(EVENTS)


def test_every_event_type_round_trips_through_kafka(bootstrap):
    events = sample_events()
    with EventProducer(bootstrap) as producer:
        for name, event in events.items():
            producer.send(TOPIC_OF[name], event, key=event["event_id"])
    consumer = EventConsumer(bootstrap, list(CATALOG), service="test")
    try:
        got = {item.name: item for item in consumer.drain(idle_s=1.0)}
    finally:
        consumer.close()
    assert set(got) == set(events)
    for name, item in got.items():
        assert item.topic == TOPIC_OF[name]
        assert item.key == events[name]["event_id"].encode()
        decoded = dict(item.event)
        decoded.pop("produced_at")
        expected = dict(events[name])
        expected.pop("produced_at")
        assert decoded == expected


def test_corrupted_and_unknown_messages_are_dead_lettered_with_their_reason(bootstrap):
    registry = default_registry()
    good = sample_events()["StepCompleted"]
    unknown = b"\xc3\x01" + (42).to_bytes(8, "little") + b"\x02"
    raw = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for payload in (b"garbage bytes", registry.encode("StepCompleted", good), unknown):
        raw.send("coevolve.steps", payload).get(timeout=10)
    raw.close()

    with EventProducer(bootstrap) as dlq:
        consumer = EventConsumer(bootstrap, ["coevolve.steps"], service="test", deadletters=dlq)
        try:
            items = consumer.drain(idle_s=1.0)
        finally:
            consumer.close()
    assert [i.event["event_id"] for i in items] == [good["event_id"]]
    assert consumer.dead_lettered == 2

    reader = EventConsumer(bootstrap, [DEADLETTER.name], service="test")
    try:
        dead = reader.drain(idle_s=1.0)
    finally:
        reader.close()
    by_type = {d.event["error_type"]: d.event for d in dead}
    assert set(by_type) == {"malformed", "unknown_schema"}
    assert by_type["malformed"]["payload"] == b"garbage bytes"
    assert by_type["malformed"]["source_offset"] == 0
    assert "coevolve.steps[0]@0" in by_type["malformed"]["reason"]
    assert by_type["unknown_schema"]["payload"] == unknown
    assert by_type["unknown_schema"]["source_offset"] == 2
    assert "000000000000002a" in by_type["unknown_schema"]["reason"]


def test_stopping_the_broker_mid_send_reports_exactly_the_undelivered_events(broker):
    create_topics(broker.bootstrap)
    producer = EventProducer(broker.bootstrap, delivery_timeout_s=3.0)
    template = sample_events()["TrajectoryRecorded"]
    before = [dict(template, event_id=f"before-{i}") for i in range(50)]
    after = [dict(template, event_id=f"after-{i}") for i in range(50)]
    for event in before:
        producer.send("coevolve.trajectories", event, key=event["task_id"])
    assert producer.flush() == 50

    broker.stop()
    for event in after:
        producer.send("coevolve.trajectories", event, key=event["task_id"])
    started = time.monotonic()
    with pytest.raises(DeliveryError) as info:
        producer.flush()
    assert time.monotonic() - started < 15
    assert sorted(info.value.undelivered) == sorted(e["event_id"] for e in after)
    assert broker.bootstrap in str(info.value)
    assert producer.sent == 50


def test_unreachable_broker_fails_with_an_error_naming_the_bootstrap():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(DeliveryError, match=address):
        producer = EventProducer(address, delivery_timeout_s=2.0)
        producer.send("coevolve.steps", sample_events()["StepCompleted"])
        producer.flush()


def test_coevolve_broker_by_hand_serves_kafka_python_and_stops_on_sigterm():
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "coevolve")
    proc = subprocess.Popen([exe, "broker", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line == f"bootstrap: 127.0.0.1:{port}"
        bootstrap = line.split(": ", 1)[1]
        topic = f"hand-{uuid.uuid4().hex[:8]}"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(topic, 1, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        for i in range(10):
            producer.send(topic, f"m{i}".encode()).get(timeout=10)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        consumer.assign([TopicPartition(topic, 0)])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += [r.value.decode() for r in records]
        consumer.close()
        assert got == [f"m{i}" for i in range(10)]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
    assert code == 0


def test_a_send_that_cannot_start_also_reports_what_was_queued_before_it(broker):
    create_topics(broker.bootstrap)
    producer = EventProducer(broker.bootstrap, delivery_timeout_s=2.0)
    template = sample_events()["StepCompleted"]
    producer.send("coevolve.steps", dict(template, event_id="warm-up"))
    assert producer.flush() == 1

    broker.stop()
    queued = [dict(template, event_id=f"queued-{i}") for i in range(10)]
    for event in queued:
        producer.send("coevolve.steps", event)
    # No metadata for this topic is known, so the send itself cannot start.
    with pytest.raises(DeliveryError) as info:
        producer.send("coevolve.never-created", dict(template, event_id="new"), record_name="StepCompleted")
    assert sorted(info.value.undelivered) == sorted([e["event_id"] for e in queued] + ["new"])


def test_true_end_offsets_count_every_record_of_a_partitions_last_batch(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic("ends", 2, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50)
    for batch in (10, 5):  # two batches on partition 0; partition 1 stays empty
        for i in range(batch):
            producer.send("ends", b"v", partition=0)
        producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    tps = [TopicPartition("ends", 0), TopicPartition("ends", 1)]
    reported = consumer.end_offsets(tps)
    consumer.close()
    assert true_end_offsets(broker.bootstrap, reported) == {tps[0]: 15, tps[1]: 0}
    assert true_end_offsets(broker.bootstrap, {tps[0]: 15}) == {tps[0]: 15}, "a correct end stays as it is"
    assert true_end_offsets(broker.bootstrap, {tps[0]: 100}, timeout_s=1) == {tps[0]: 100}, "never lowered"


def test_a_services_producer_writes_its_row_of_writes_and_refuses_every_other_topic(bootstrap):
    events = sample_events()
    with EventProducer(bootstrap, service="learner") as producer:
        producer.send(STEPS.name, events["StepCompleted"], key="r1")
        with pytest.raises(NotWritable, match="the learner wrote coevolve.signals.*kafka-users.yaml"):
            producer.send(SIGNALS.name, events["SignalRaised"], key="t")
    assert producer.sent == 1  # confirmed at the flush on leaving the block
    assert [i.name for i in EventConsumer(bootstrap, [SIGNALS.name], service="t").read_to_end()] == []
    assert all(DEADLETTER.name in topics for topics in WRITES.values())  # every service dead-letters its bad input


def test_a_commit_below_a_held_record_stops_there_and_commits_the_other_partitions_whole(bootstrap):
    create_topics(bootstrap)
    step = sample_events()["StepCompleted"]
    with EventProducer(bootstrap) as producer:
        for i in range(3):
            producer.send(STEPS.name, {**step, "event_id": f"s{i}", "step": i}, key="r")
    signal = sample_events()["SignalRaised"]
    with EventProducer(bootstrap) as producer:
        producer.send(SIGNALS.name, signal, key="t")
    group = f"holds-{uuid.uuid4().hex[:6]}"
    consumer = EventConsumer(bootstrap, [STEPS.name, SIGNALS.name], group_id=group, service="test")
    try:
        got, deadline = [], time.monotonic() + 60
        while len(got) < 4 and time.monotonic() < deadline:  # a group joins after its rebalance wait
            got += consumer.poll(0.5)
        assert len(got) == 4
        signal_partition = next(d.partition for d in got if d.topic == SIGNALS.name)
        assert consumer.commit(below={(STEPS.name, 0): 1})  # step 1 still held: steps commits up to it
    finally:
        consumer.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        committed = {(tp.topic, tp.partition): m.offset for tp, m in admin.list_group_offsets(group)[group].items()
                     if m.offset >= 0}
    finally:
        admin.close()
    assert committed[(STEPS.name, 0)] == 1 and committed[(SIGNALS.name, signal_partition)] == 1
