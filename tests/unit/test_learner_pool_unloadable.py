"""A task whose episode cannot start is refused or dropped by the pool, dead-lettered and counted by the
learner, and a step that draws one trains on a replacement instead of crashing."""
import itertools
import json
import logging
import time
import uuid

from coevolve.schemas.codec import default_registry
from coevolve.services.agent.config import BackendConfig, EpisodeLimits, SamplingConfig
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.kafka.consumer import dead_letter_id
from coevolve.services.kafka.topics import DEADLETTER, TASKS
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, LearnerSettings, SamplerConfig
from coevolve.services.learner.loop.sampler import Origin, TaskPool, load_problem
from coevolve.services.learner.loop.service import Learner
from coevolve.services.learner.loop.results import Update
from coevolve.services.learner.loop.step import StepRunner
from tests.agent_helpers import ScriptedBackend, byte_tokenizer

SEEDS = load_tasks(split="train")[:4]
BASE = load_tasks(split="train")[5]  # TwitterAPI and GorillaFileSystem
UNLOADABLE = {**BASE.initial_state, "GorillaFileSystem": {"root": 5}}  # the file system's loader fails on it


def task_checked(task_id: str, initial_state=BASE.initial_state) -> dict:
    return {**BASE.to_record(), "initial_state": json.dumps(initial_state, sort_keys=True), "task_id": task_id,
            "event_id": str(uuid.uuid4()), "run_id": "r", "step": 1, "source": "synthesized",
            "verdict": "validated", "reason": "", "signal_ids": [], "exploration_ids": [],
            "validation_score": None, "stage": None, "stages": [], "seed_task_id": None,
            "produced_at": int(time.time() * 1000)}


def unloadable_task(task_id: str = "bad-seed") -> Task:
    return Task.from_record(task_checked(task_id, UNLOADABLE))


def test_the_check_is_the_episode_start():
    assert load_problem(BASE) is None
    assert load_problem(unloadable_task()).startswith("InvalidTask: cannot load the initial state of GorillaFileSystem")


def test_an_arrival_that_cannot_load_is_refused_and_the_pool_takes_the_next():
    pool = TaskPool(SEEDS, SamplerConfig(), rng_seed=7)
    where = Origin(TASKS.name, 0, 41, b"syn-bad")
    pool.offer(task_checked("syn-bad", UNLOADABLE), where)
    pool.offer(task_checked("syn-good"), Origin(TASKS.name, 0, 42, b"syn-good"))
    pool.refresh(1)
    assert list(pool.synthesized) == ["syn-good"] and pool.size == 5
    (bad,) = pool.take_unloadable()
    assert bad.task_id == "syn-bad" and bad.origin == where and bad.record["task_id"] == "syn-bad"
    assert "cannot load the initial state of GorillaFileSystem" in bad.reason
    assert pool.take_unloadable() == [] and len(pool.draw(5)) == 5
    pool.offer(task_checked("syn-bad"))  # a fixed version of the same id is welcome
    pool.refresh(2)
    assert sorted(pool.synthesized) == ["syn-bad", "syn-good"] and pool.take_unloadable() == []


def test_a_drawn_task_that_cannot_load_is_dropped_and_replaced():
    pool = TaskPool([unloadable_task(), *SEEDS[:2]], SamplerConfig(), rng_seed=7)
    drawn = pool.draw(3)  # the pool holds three: the bad one is drawn, then replaced
    assert len(drawn) == 3 and "bad-seed" not in {d.task.task_id for d in drawn}
    (bad,) = pool.take_unloadable()
    assert bad.task_id == "bad-seed" and bad.origin is None and pool.size == 2
    state = pool.state()
    assert state["dropped_seeds"] == ["bad-seed"]
    restored = TaskPool([unloadable_task(), *SEEDS[:2]], SamplerConfig(), rng_seed=0)
    restored.restore(state)
    assert "bad-seed" not in restored.seed_tasks


def test_a_step_that_draws_an_unloadable_task_trains_on_a_replacement():
    answers = itertools.cycle(["yes", "no"])
    backend = ScriptedBackend(byte_tokenizer(), lambda request: next(answers))
    pool = TaskPool([unloadable_task(), *SEEDS[:2]], SamplerConfig(), rng_seed=1)
    runner = StepRunner(LearnerConfig(batch_tasks=3, group_size=2), GRPOConfig(), pool, backend, None,
                        SamplingConfig(temperature=1.0, max_new_tokens=8),
                        EpisodeLimits(max_user_turns=1, max_context_tokens=100_000), "run-u",
                        lambda episode: float(any("yes" in m["content"] for m in episode.messages)))
    runner.update_and_push = lambda batch: Update({}, False)
    result = runner.run(1)
    assert result.record.trajectory_count == 6
    assert "bad-seed" not in {t["task_id"] for t in result.trajectories}
    assert [u.task_id for u in pool.take_unloadable()] == ["bad-seed"]


class Producer:
    def __init__(self):
        self.registry = default_registry()
        self.sent = []
        self.flushed = 0

    def send(self, topic, record, key=None):
        self.registry.encode("DeadLettered", record)  # what the broker would get must encode
        self.sent.append((topic, record, key))

    def flush(self):
        self.flushed += 1


def test_the_learner_dead_letters_counts_and_logs_a_refused_arrival(tmp_path, caplog):
    service = Learner(LearnerSettings(LearnerConfig(workdir=tmp_path),
                                      backend=BackendConfig(model="tiny-random", backend="transformers")))
    service.producer = producer = Producer()
    service.pool = TaskPool(SEEDS, SamplerConfig())
    record = task_checked("syn-bad", UNLOADABLE)
    service.pool.offer(record, Origin(TASKS.name, 2, 17, b"syn-bad"))
    service.pool.refresh(1)
    with caplog.at_level(logging.WARNING, logger="coevolve.learner"):
        service._report_unloadable()
    ((topic, letter, key),) = producer.sent
    assert topic == DEADLETTER.name and key == TASKS.name and producer.flushed == 1
    assert letter["error_type"] == "task_unloadable" and letter["service"] == "learner"
    assert (letter["source_topic"], letter["source_partition"], letter["source_offset"]) == (TASKS.name, 2, 17)
    assert letter["event_id"] == dead_letter_id("learner", TASKS.name, 2, 17, "task_unloadable", letter["payload"])
    name, decoded = producer.registry.decode(letter["payload"], TASKS.name, 2, 17)
    assert name == "TaskChecked" and decoded["task_id"] == "syn-bad"
    assert service.registry.get_sample_value("learner_tasks_unloadable_total") == 1.0
    (logged,) = [r.fields for r in caplog.records if r.getMessage() == "learner.task_unloadable"]
    assert logged["task_id"] == "syn-bad" and "GorillaFileSystem" in logged["reason"] and logged["dead_lettered"]
