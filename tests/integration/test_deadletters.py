"""Dead letters on the real broker: one per bad input however often it is delivered, listed by service
and reason, replayed once to their source topic; a commit the group refuses does not end a consumer."""
import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from typer.testing import CliRunner

from coevolve.schemas import default_registry
from coevolve.services.cli import app
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.deadletters import read_letters, replay, summarize
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER, SIGNALS, STEPS
from tests.cli_output import plain
from tests.events import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _consume_twice(bootstrap: str, topic: str) -> None:
    """Two consumers of one service read the same bad messages (a redelivery) and dead-letter them."""
    for _ in range(2):
        with EventProducer(bootstrap) as letters:
            consumer = EventConsumer(bootstrap, [topic], service="explorer", deadletters=letters)
            try:
                consumer.read_to_end()
            finally:
                consumer.close()


def test_a_redelivered_bad_input_is_one_letter_listed_and_replayed_once(bootstrap):
    step = {"event_id": "s1", "run_id": "r", "step": 1, "trajectory_count": 0, "produced_at": 1}
    good = default_registry().encode("StepCompleted", step)
    with EventProducer(bootstrap) as producer:
        producer.send_raw(STEPS.name, b"\xc3\x01garbage", b"r", "bad")
        producer.send_raw(STEPS.name, good[:5], b"r", "cut")
    _consume_twice(bootstrap, STEPS.name)
    letters = read_letters(bootstrap)
    ids = [i.event["event_id"] for i in read_topic(bootstrap, DEADLETTER.name)]
    assert len(ids) == 4 and len(set(ids)) == 2 and len(letters) == 2  # four deliveries, two letters
    summary = summarize(letters)
    assert sum(summary.counts.values()) == 2 and all(service == "explorer" for service, _ in summary.counts)
    listed = plain(CliRunner().invoke(app, ["deadletters", "list", "--bootstrap", bootstrap]).output)
    assert "explorer" in listed and "coevolve.steps:0@0" in listed and "coevolve.steps:0@1" in listed
    future = CliRunner().invoke(app, ["deadletters", "list", "--bootstrap", bootstrap, "--since", "2999-01-01"])
    assert "no dead letters since 2999-01-01" in plain(future.output)
    reason = letters[0]["error_type"]
    sent = replay(bootstrap, reason, "explorer")
    assert sorted(s["event_id"] for s in sent) == sorted(s["event_id"] for s in letters if s["error_type"] == reason)
    again = CliRunner().invoke(app, ["deadletters", "replay", "--reason", reason, "--service", "explorer",
                                     "--bootstrap", bootstrap])
    assert again.exit_code == 0 and "replayed 0 dead letter(s)" in plain(again.output)
    raw = _raw(bootstrap, STEPS.name, expected=2 + len(sent))
    for letter in sent:  # the original message and exactly one replay of its bytes
        assert raw.count(letter["payload"]) == 2


def _raw(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        part = TopicPartition(topic, 0)
        consumer.assign([part])
        consumer.seek_to_beginning(part)
        out: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(out) < expected and time.monotonic() < deadline:
            out += [m.value for batch in consumer.poll(timeout_ms=500).values() for m in batch]
        time.sleep(1.0)  # a replay sent twice would be here by now
        out += [m.value for batch in consumer.poll(timeout_ms=500).values() for m in batch]
        return out
    finally:
        consumer.close()


def test_a_commit_refused_after_a_rebalance_is_reported_and_the_consumer_goes_on(bootstrap):
    with EventProducer(bootstrap) as producer:
        producer.send_raw(SIGNALS.name, b"x", b"k", "x")
    consumer = EventConsumer(bootstrap, [SIGNALS.name], group_id="commit-refused", service="test",
                             group_timeouts_ms={"max_poll_interval_ms": 3000})
    try:
        deadline = time.monotonic() + 30
        while not consumer.assigned() and time.monotonic() < deadline:
            consumer.poll(0.5)
        time.sleep(6)  # past max_poll_interval_ms: the member is put out of the group
        assert consumer.commit() is False and consumer.commits_failed == 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            consumer.poll(0.5)  # rejoins
            if consumer.assigned() and consumer.commit():
                break
        else:
            raise AssertionError("the consumer never committed again after rejoining")
    finally:
        consumer.close()
