"""A (re)started validator knows the tasks validated before it: it reads the compacted coevolve.tasks."""
import dataclasses

import pytest

from coevolve.services.agent.config import BackendConfig
from coevolve.services.envs import bfcl_data
from coevolve.services.kafka.consumer import EventConsumer, ReadShort
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import TASKS
from coevolve.services.validator.config import ValidatorServiceConfig, ValidatorSettings
from coevolve.services.validator.service import Validator
from coevolve.services.validator.stages import StageOutcome
from coevolve.services.validator.verdict import Verdict, verdict_record

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _task(task_id: str, turn: str, call: str):
    seed = bfcl_data.get_task("multi_turn_base_0")
    return dataclasses.replace(seed, task_id=task_id, turns=(turn,), reference=((call,),))


def _record(task, validated: bool) -> dict:
    stage = StageOutcome("dual_pass", validated, "attempt scored 1.00" if validated else "attempt scored 0.00")
    return verdict_record(Verdict(task, validated, (stage,), 1.0 if validated else 0.0), "r0", 3,
                          "multi_turn_base_0", [], ["e1"], 1_795_000_000_000)


def test_a_started_validator_counts_the_tasks_validated_before_as_known(bootstrap):
    kept = _task("synthesized_kept", "Show every file in the current folder, hidden ones too, then stop.", "ls(a=True)")
    dropped = _task("synthesized_dropped", "Count the lines of each report and compare the two totals.", "pwd()")
    changed = _task("synthesized_changed", "Archive the newest draft under a dated name for the auditors.", "ls()")
    with EventProducer(bootstrap) as producer:
        for record in (_record(kept, True), _record(dropped, False), _record(changed, True),
                       _record(changed, False)):  # the last verdict of a task is the one that holds
            producer.send(TASKS.name, record, key=record["task_id"])
        producer.flush()
    validator = Validator(ValidatorSettings(service=ValidatorServiceConfig(kafka_bootstrap=bootstrap, group_id="catalog"),
                                            backend=BackendConfig(model="tiny-random", backend="transformers")))
    try:
        validator.start()
        seeds, index = len(bfcl_data.load_tasks(split="all")), validator.indexes.get("r0")
        assert len(index) == seeds + 1
        again = dataclasses.replace(kept, task_id="synthesized_again")
        outcome = index.check(again)
        assert not outcome.passed and "synthesized_kept" in outcome.reason
        assert index.check(dataclasses.replace(dropped, task_id="synthesized_new")).passed
        # another run on the same broker checks against the seeds and its own tasks only (inherit_tasks off)
        assert len(validator.indexes.get("r1")) == seeds and validator.indexes.get("r1").check(again).passed
    finally:
        validator.finish()


def test_a_catalog_read_that_falls_short_refuses_to_start_instead_of_judging(bootstrap):
    seed = _task("synthesized_seen", "Show every file in the current folder, hidden ones too, then stop.", "ls(a=True)")
    with EventProducer(bootstrap) as producer:
        for i in range(200):
            record = _record(dataclasses.replace(seed, task_id=f"synthesized_{i}"), True)
            producer.send(TASKS.name, record, key=record["task_id"])
    service = ValidatorServiceConfig(kafka_bootstrap=bootstrap, group_id="short", catalog_read_s=1e-6)
    validator = Validator(ValidatorSettings(service=service,
                                            backend=BackendConfig(model="tiny-random", backend="transformers")))
    try:
        with pytest.raises(ReadShort, match=r"validator-catalog read coevolve.tasks:\d.* short of the end"):
            validator.start()
        assert validator.consumer is None and not validator.judged  # nothing polled, nothing judged
    finally:
        validator.finish()


def test_a_catalog_read_given_no_partition_refuses_to_start(broker):
    """A broker that lists no partition of coevolve.tasks within the metadata wait (restarting, a missing
    Describe ACL, the topic not made yet) gives the catalog reader an empty assignment: the read fails,
    instead of reading nothing and judging groups already judged."""
    reader = EventConsumer(broker.bootstrap, [TASKS.name], service="validator-catalog", metadata_timeout_s=1.0)
    try:
        assert not reader.assigned()
        with pytest.raises(ReadShort, match=r"validator-catalog was given no partition of coevolve.tasks"):
            reader.read_to_end(5.0, complete=True)
        assert reader.read_to_end(1.0) == []  # a read that may be short still returns what there is
    finally:
        reader.close()
