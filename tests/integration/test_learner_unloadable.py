"""A validated task that cannot load, published on coevolve.tasks, is dead-lettered by the learner, which
trains on with the rest of its pool (real embedded broker, `tiny-random` model)."""
import json

import pytest

from coevolve.schemas.codec import default_registry
from coevolve.services.envs.config import SeedPoolConfig
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER, STEPS, TASKS
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, LearnerSettings, SamplerConfig
from coevolve.services.learner.loop.service import Learner
from tests.integration.test_learner_service import BACKEND, LIMITS, odd_length, read, task_checked

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_an_unloadable_task_is_dead_lettered_and_the_learner_trains_on(bootstrap, tmp_path):
    good = task_checked("validated", task_id="syn-good", run_id="run-poison")
    state = json.loads(good["initial_state"])
    bad = {**task_checked("validated", task_id="syn-bad", run_id="run-poison"),
           "initial_state": json.dumps({**state, "GorillaFileSystem": {"root": 5}})}
    producer = EventProducer(bootstrap)
    for record in (bad, good):
        producer.send(TASKS.name, record, key=record["task_id"])
    producer.flush()
    producer.close()
    cfg = LearnerConfig(kafka_bootstrap=bootstrap, workdir=tmp_path, steps=1, batch_tasks=2, group_size=2,
                        run_id="run-poison", max_new_tokens=8)
    service = Learner(LearnerSettings(cfg, GRPOConfig(lr=1e-3), SamplerConfig(sampler="static", static_wait_s=4.0),
                                      SeedPoolConfig(seed_tasks=3), backend=BACKEND, limits=LIMITS),
                      reward=odd_length)
    service.run()
    assert service.done == 1
    assert service.registry.get_sample_value("learner_tasks_unloadable_total") == 1.0
    (step,) = read(bootstrap, [STEPS.name])
    assert (step["pool_size"], step["pool_synthesized"]) == (4, 1)
    (letter,) = read(bootstrap, [DEADLETTER.name])
    assert letter["error_type"] == "task_unloadable" and letter["service"] == "learner"
    assert letter["source_topic"] == TASKS.name and letter["key"] == b"syn-bad"
    assert "cannot load the initial state of GorillaFileSystem" in letter["reason"]
    name, payload = default_registry().decode(letter["payload"], TASKS.name, letter["source_partition"],
                                              letter["source_offset"])
    assert name == "TaskChecked" and payload["task_id"] == "syn-bad"
