"""Which dead letters a replay may put back: a payload of the record type its source topic carries, and
on coevolve.tasks only the validator's own letters when the operator names the topic."""
import pytest

from coevolve.schemas import default_registry
from coevolve.services.kafka.consumer import dead_letter
from coevolve.services.kafka.deadletters import held_back
from coevolve.services.kafka.topics import DEADLETTER, EXPLORATIONS, SIGNALS, STEPS, TASKS
from tests.events import sample_events

EVENTS = sample_events()


def letter(topic: str, record: str | None, service: str, payload: bytes | None = None) -> dict:
    body = payload if payload is not None else default_registry().encode(record, EVENTS[record])
    return dead_letter(topic, 0, 7, b"k", body, "invalid", "test", service)


def test_a_payload_of_its_topics_record_type_is_replayed():
    assert held_back(letter(STEPS.name, "StepCompleted", "archiver"), None) is None
    assert held_back(letter(EXPLORATIONS.name, "ExplorationRecorded", "validator"), None) is None


def test_a_payload_of_another_record_type_is_held_back_with_what_the_topic_carries():
    why = held_back(letter(SIGNALS.name, "ExplorationRecorded", "explorer"), None)
    assert why == "its payload is ExplorationRecorded, and coevolve.signals carries SignalRaised only"


@pytest.mark.parametrize("payload", [b"\xc3\x01garbage", b"not avro", b""])
def test_a_payload_that_does_not_decode_is_held_back(payload):
    why = held_back(letter(STEPS.name, None, "explorer", payload), None)
    assert why.startswith("its payload does not decode") and "dead-lettered again" in why


@pytest.mark.parametrize("topic", ["coevolve.elsewhere", DEADLETTER.name])
def test_a_topic_outside_the_event_topics_is_held_back(topic):
    assert "is not a topic a replay writes" in held_back(letter(topic, "StepCompleted", "explorer"), None)


def test_a_forged_task_letter_never_reaches_the_task_stream():
    forged = letter(TASKS.name, "TaskChecked", "explorer")  # any service may write a letter
    assert "validator's output" in held_back(forged, None)
    assert "validator's output" in held_back(forged, TASKS.name)  # not even when the operator names it
    learners = letter(TASKS.name, "TaskChecked", "learner")
    assert "restart it instead" in held_back(learners, TASKS.name)


def test_the_validators_own_task_letter_goes_back_only_when_the_operator_names_the_topic():
    own = letter(TASKS.name, "TaskChecked", "validator-catalog")
    assert "--topic coevolve.tasks" in held_back(own, None)
    assert held_back(own, TASKS.name) is None


def test_a_letter_is_proven_only_by_the_record_at_its_source_position():
    from coevolve.services.kafka.deadletters import unproven

    registry = default_registry()
    own = letter(TASKS.name, "TaskChecked", "validator-catalog")
    record = bytes(own["payload"])
    assert unproven(own, record) is None
    name, event = registry.decode(record)
    reencoded = dict(own, payload=registry.encode(name, event))  # a rejected event is re-encoded
    assert unproven(reencoded, record) is None
    invented = letter(TASKS.name, None, "validator", registry.encode("TaskChecked", {**event, "task_id": "invented"}))
    assert "is not the record at coevolve.tasks:0@7" in unproven(invented, record)
    assert "no record is at coevolve.tasks:0@7 any more" in unproven(own, None)
    assert "is not the record" in unproven(letter(STEPS.name, None, "explorer", b"not avro"), b"other bytes")
