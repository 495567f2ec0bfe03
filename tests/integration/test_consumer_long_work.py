"""A group member whose work outlasts `max_poll_interval_ms` (a model's) keeps its group inside `working()`.

The poll interval here is 3 s instead of the services' 10 s, so the tests take seconds: work of 6 s
without `working()` puts the member out of its group and its commit fails; with it, the commit holds
and a second member of the group resumes after the committed offsets.
"""
import time

import pytest
from kafka import TopicPartition

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import SIGNALS
from tests.unit.test_explorer_reflection import boundary_signal

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SHORT = {"max_poll_interval_ms": 3000, "session_timeout_ms": 3000}
WORK_S = 6.0


def _publish(bootstrap: str, ids: list[str]) -> None:
    with EventProducer(bootstrap) as producer:
        for signal_id in ids:
            record = boundary_signal(signal_id)
            producer.send(SIGNALS.name, record, key=record["task_id"])
        producer.flush()


def _consumer(bootstrap: str, group: str) -> EventConsumer:
    return EventConsumer(bootstrap, [SIGNALS.name], group_id=group, service="test", group_timeouts_ms=SHORT)


def _poll_ids(consumer: EventConsumer, want: int, timeout_s: float = 30.0) -> list[str]:
    ids: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(ids) < want and time.monotonic() < deadline:
        ids += [str(item.event["event_id"]) for item in consumer.poll(0.5)]
    return ids


def test_work_past_the_poll_interval_without_working_loses_the_group(bootstrap):
    _publish(bootstrap, ["a1", "a2"])
    consumer = _consumer(bootstrap, "lost")
    try:
        assert sorted(_poll_ids(consumer, 2)) == ["a1", "a2"]
        time.sleep(WORK_S)  # the heartbeat thread leaves the group: the hazard `working()` removes
        assert consumer.commit() is False and consumer.commits_failed == 1  # refused, reported, not raised
    finally:
        consumer.close()


def test_work_inside_working_keeps_the_group_commits_and_holds_what_arrived(bootstrap):
    _publish(bootstrap, ["b1", "b2"])
    consumer = _consumer(bootstrap, "kept")
    try:
        assert sorted(_poll_ids(consumer, 2)) == ["b1", "b2"]
        with consumer.working(every_s=0.5):
            _publish(bootstrap, ["b3"])  # arrives during the work: paused, so not lost and not skipped
            time.sleep(WORK_S)
        consumer.commit()
        assert _poll_ids(consumer, 1) == ["b3"]
        consumer.commit()
        committed = sum(consumer._consumer.committed(TopicPartition(SIGNALS.name, p)) or 0
                        for p in range(SIGNALS.partitions))
        assert committed == 3
    finally:
        consumer.close()
    again = _consumer(bootstrap, "kept")  # a restart resumes after the committed offsets
    try:
        _publish(bootstrap, ["b4"])
        assert _poll_ids(again, 1) == ["b4"]
    finally:
        again.close()


def test_partitions_handed_over_during_the_work_are_delivered_after_it_even_past_a_commit(bootstrap):
    first, second = _consumer(bootstrap, "handover"), _consumer(bootstrap, "handover")
    deadline = time.monotonic() + 30.0
    while not (first.assigned() and second.assigned()) and time.monotonic() < deadline:
        first.poll(0.2), second.poll(0.2)
    assert first.assigned() and second.assigned(), "both members should hold partitions"
    with EventProducer(bootstrap) as producer:
        for i in range(40):  # keys spread over every partition, so both members' shares get records
            producer.send(SIGNALS.name, boundary_signal(f"h{i}", task_id=f"multi_turn_base_{i}"), key=f"k{i}")
        producer.flush()
    try:
        with first.working(every_s=0.2):
            second.close()  # its partitions move to the member that is working
            deadline = time.monotonic() + 30.0
            while len(first._consumer.assignment()) < SIGNALS.partitions and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)  # keep-alive polls meanwhile, on every partition now
        handed = {tp.partition for tp in first._consumer.assignment()}
        first.commit()  # then a crash before the next poll(): the commit must not cover unread records
    finally:
        first.close()
    assert handed == set(range(SIGNALS.partitions))
    successor = _consumer(bootstrap, "handover")
    try:
        assert sorted(_poll_ids(successor, 40)) == sorted(f"h{i}" for i in range(40))
    finally:
        successor.close()
