"""Dead letters on the real broker: one per bad input however often it is delivered, listed by service
and reason, replayed once to their source topic when the payload belongs there (a forged letter never
reaches coevolve.tasks); a commit the group refuses does not end a consumer."""
import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from typer.testing import CliRunner

from coevolve.schemas import default_registry
from coevolve.services.cli import app
from coevolve.services.kafka.consumer import EventConsumer, dead_letter
from coevolve.services.kafka.deadletters import read_letters, republish, summarize
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER, SIGNALS, STEPS, TASKS
from tests.cli_output import plain
from tests.events import read_topic, sample_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _consume_twice(bootstrap: str, topic: str) -> None:
    """Two consumers of one service read the same messages (a redelivery): they dead-letter the ones that do not
    decode and reject every StepCompleted as `invalid`."""
    for _ in range(2):
        with EventProducer(bootstrap) as letters:
            consumer = EventConsumer(bootstrap, [topic], service="explorer", deadletters=letters)
            try:
                for item in consumer.read_to_end():
                    consumer.reject(item, "invalid", "rejected by the test")
            finally:
                consumer.close()


def test_a_redelivered_bad_input_is_one_letter_listed_and_replayed_once(bootstrap):
    step = {"event_id": "s1", "run_id": "r", "step": 1, "trajectory_count": 0, "produced_at": 1}
    good = default_registry().encode("StepCompleted", step)
    with EventProducer(bootstrap) as producer:
        producer.send_raw(STEPS.name, b"\xc3\x01garbage", b"r", "bad")
        producer.send_raw(STEPS.name, good[:5], b"r", "cut")
        producer.send_raw(STEPS.name, good, b"r", "s1")
    _consume_twice(bootstrap, STEPS.name)
    letters = read_letters(bootstrap)
    ids = [i.event["event_id"] for i in read_topic(bootstrap, DEADLETTER.name)]
    assert len(ids) == 6 and len(set(ids)) == 3 and len(letters) == 3  # six deliveries, three letters
    summary = summarize(letters)
    assert sum(summary.counts.values()) == 3 and all(service == "explorer" for service, _ in summary.counts)
    listed = plain(CliRunner().invoke(app, ["deadletters", "list", "--bootstrap", bootstrap]).output)
    assert all(f"coevolve.steps:0@{offset}" in listed for offset in range(3)) and "explorer" in listed
    future = CliRunner().invoke(app, ["deadletters", "list", "--bootstrap", bootstrap, "--since", "2999-01-01"])
    assert "no dead letters since 2999-01-01" in plain(future.output)
    malformed = republish(bootstrap, "malformed", "explorer")  # bytes that would only be dead-lettered again
    assert not malformed.sent and len(malformed.held) == 2
    assert all(why.startswith("its payload does not decode") for _, why in malformed.held)
    done = republish(bootstrap, "invalid", "explorer")
    assert [s["event_id"] for s in done.sent] == [s["event_id"] for s in letters if s["error_type"] == "invalid"]
    again = CliRunner().invoke(app, ["deadletters", "replay", "--reason", "invalid", "--service", "explorer",
                                     "--bootstrap", bootstrap])
    assert again.exit_code == 0 and "replayed 0 dead letter(s)" in plain(again.output)
    raw = _raw(bootstrap, STEPS.name, expected=4)
    assert raw.count(good) == 2 and raw.count(b"\xc3\x01garbage") == 1  # the original and one replay


def test_a_forged_letter_does_not_reach_the_task_stream_and_the_validators_own_goes_back_when_named(bootstrap):
    """Any client may write a letter, and may claim to be the validator: only a payload that the record at the
    letter's source position proves goes back, so a replay never puts new content on coevolve.tasks."""
    registry = default_registry()
    verdict = registry.encode("TaskChecked", sample_events()["TaskChecked"])
    invented = registry.encode("TaskChecked", {**sample_events()["TaskChecked"], "task_id": "invented",
                                               "verdict": "validated", "reason": "trust me"})
    with EventProducer(bootstrap) as producer:
        producer.send_raw(TASKS.name, verdict, b"t", "v")
    (held,) = read_topic(bootstrap, TASKS.name)
    at = (TASKS.name, held.partition, held.offset)
    forged = dead_letter(*at, b"t", verdict, "invalid", "forged", "explorer")
    claimed = dead_letter(*at, b"t", invented, "invalid", "catalog", "validator")  # claims to be the validator
    nowhere = dead_letter(TASKS.name, held.partition, held.offset + 5, b"t", verdict, "invalid", "catalog",
                          "validator-catalog")
    elsewhere = dead_letter(TASKS.name, 99, 0, b"t", verdict, "invalid", "catalog", "validator-catalog")
    own = dead_letter(*at, b"t", verdict, "invalid", "catalog", "validator-catalog")
    with EventProducer(bootstrap) as producer:
        for letter in (forged, claimed, nowhere, elsewhere, own):
            producer.send(DEADLETTER.name, letter, key=TASKS.name)
    unnamed = CliRunner().invoke(app, ["deadletters", "replay", "--reason", "invalid", "--bootstrap", bootstrap])
    assert unnamed.exit_code == 0 and "replayed 0 dead letter(s)" in plain(unnamed.output)
    assert plain(unnamed.output).count("held back") == 5
    named = republish(bootstrap, "invalid", topic=TASKS.name)
    assert [s["event_id"] for s in named.sent] == [own["event_id"]]
    why = {letter["event_id"]: reason for letter, reason in named.held}
    assert "validator's output" in why[forged["event_id"]]
    assert "is not the record at" in why[claimed["event_id"]]
    assert "no record is at" in why[nowhere["event_id"]] and "no record is at" in why[elsewhere["event_id"]]
    assert _raw(bootstrap, TASKS.name, expected=2, partitions=TASKS.partitions) == [verdict, verdict]


def _raw(bootstrap: str, topic: str, expected: int, partitions: int = 1) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
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
