"""A validator killed between publishing a verdict and committing: its successor reads the same group
again and must leave the verdict alone. Bad input on its topic is dead-lettered while it keeps running."""
import json

import pytest

from coevolve.schemas import default_registry
from coevolve.services.agent import backends
from coevolve.services.agent.config import BackendConfig
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER, EXPLORATIONS, TASKS
from coevolve.services.validator.config import ValidatorConfig, ValidatorServiceConfig, ValidatorSettings
from coevolve.services.validator.service import Validator
from tests.events import read_topic
from tests.unit.test_validator_service import CALLS, LIMITS, PROPOSAL, _backend, _group

pytestmark = [pytest.mark.integration, pytest.mark.slow]
GROUP = "validator-redelivery"


def _validator(bootstrap: str, monkeypatch, attempt: str) -> Validator:
    """A validator whose model is scripted: abstractions answer PROPOSAL, the dual-pass agent `attempt`."""
    monkeypatch.setattr(backends, "make_backend", lambda cfg: _backend(json.dumps(PROPOSAL), attempt))
    validator = Validator(ValidatorSettings(ValidatorConfig(rounds_per_group=2),
                                            ValidatorServiceConfig(kafka_bootstrap=bootstrap, group_id=GROUP,
                                                                   group_wait_s=600),
                                            backend=BackendConfig(model="tiny-random")))
    validator.limits = LIMITS  # the scripted model's byte tokenizer spends a token per byte
    validator.start()
    return validator


def _run_until(validator: Validator, done, steps: int = 60) -> None:
    for _ in range(steps):
        validator.poll()
        if done():
            return
    raise AssertionError(f"the validator did not get there in {steps} polls: {validator.details()}")


def test_a_group_redelivered_after_a_crash_keeps_its_one_verdict(bootstrap, monkeypatch):
    with EventProducer(bootstrap) as producer:
        for record in _group():
            producer.send(EXPLORATIONS.name, record, key=record["task_id"])
    first = _validator(bootstrap, monkeypatch, "[" + ", ".join(CALLS) + "]")  # its agent solves the task
    monkeypatch.setattr(first, "_commit", lambda: False)  # killed before its commit lands
    try:
        _run_until(first, lambda: first.checked == 1)
    finally:
        first.consumer.close()
        first.producer.close()
    # The successor's agent would fail the task: judging it again would publish a rejection over it.
    second = _validator(bootstrap, monkeypatch, "[ls()]")
    try:
        _run_until(second, lambda: second.m_judged._value.get() == 1)
        for _ in range(5):
            second.poll()
        assert second.checked == 0
    finally:
        second.finish()
    verdicts = [i.event for i in read_topic(bootstrap, TASKS.name) if i.name == "TaskChecked"]
    assert [v["verdict"] for v in verdicts] == ["validated"]


def test_events_the_validator_cannot_take_are_dead_lettered_and_it_goes_on(bootstrap, monkeypatch):
    registry = default_registry()
    verdict = {"event_id": "v1", "task_id": "synthesized_x", "run_id": "r", "step": 1, "source": "synthesized",
               "verdict": "validated", "instruction_turns": ["a"], "initial_state": "{}",
               "involved_classes": ["MathAPI"], "reference_solution": [["mean(numbers=[1])"]], "produced_at": 1}
    with EventProducer(bootstrap) as producer:
        producer.send_raw(EXPLORATIONS.name, registry.encode("TaskChecked", verdict), b"k", "v1")
        producer.send_raw(EXPLORATIONS.name, b"not an event", b"k", "garbage")
        for record in _group():
            producer.send(EXPLORATIONS.name, record, key=record["task_id"])
    validator = _validator(bootstrap, monkeypatch, "[" + ", ".join(CALLS) + "]")
    try:
        _run_until(validator, lambda: validator.checked == 1)
        assert validator.validated == 1
    finally:
        validator.finish()
    letters = {i.event["error_type"]: i.event for i in read_topic(bootstrap, DEADLETTER.name)}
    assert set(letters) == {"invalid", "malformed"} and letters["invalid"]["service"] == "validator"
    assert "expected ExplorationRecorded, got TaskChecked" in letters["invalid"]["reason"]
    assert letters["malformed"]["payload"] == b"not an event"
