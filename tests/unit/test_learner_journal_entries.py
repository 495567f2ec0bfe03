"""The learner's step journal: entries round-trip exactly, appear only once renamed into place, are pruned
by a checkpoint, and a resumed learner replays them (the update on the journaled batch, the pool's state,
the records sent again) instead of re-running the steps."""
import logging

import pytest

from coevolve.services.agent.config import BackendConfig
from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.kafka.topics import EVALUATIONS, POLICY, STEPS, TRAJECTORIES
from coevolve.services.learner.loop import journal
from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.config import LearnerConfig, LearnerSettings, SamplerConfig
from coevolve.services.learner.loop.sampler import TaskPool
from coevolve.services.learner.loop.resume import redo_journaled, run_to_continue
from coevolve.services.learner.loop.service import Learner
from coevolve.services.learner.loop.record import StepRecord
from coevolve.services.runtime.config import ConfigError

SEEDS = load_tasks(split="train")[:3]
FRESH_POOL = TaskPool(SEEDS, SamplerConfig(), rng_seed=3).state()


def entry(step: int, run_id: str = "run-j", trained: bool = True, published: bool = False) -> journal.Entry:
    batch = [TrainSequence([5, 6, 7, 8], [0, 1, 1, 0], [0.0, -0.1234567890123457, -1 / 3, 0.0], 0.7071067811865476),
             TrainSequence([5, 6, 9], [0, 0, 1], [0.0, 0.0, -2.5e-9], -0.7071067811865476)] if trained else []
    trajectories = [{"event_id": f"t-{step}-{i}", "step": step, "task_id": "a", "score": i / 3,
                     "actions": [{"name": "ls", "arguments": "{}", "observation": "é", "turn": 0}]}
                    for i in range(2)]
    record = StepRecord(
        event_id=f"s-{step}", run_id=run_id, step=step, trajectory_count=2, policy_version=step, train_reward=1 / 6,
        eval_success=0.5 if step == 2 else None, loss=0.125 * step if trained else None, duration_seconds=1.5,
        pool_size=3, pool_synthesized=0, zero_variance_groups=0, resampled_groups=0, tokens_trained=3 if trained else 0,
        synthesized_trained=0, synthesized_tasks_trained=0, staleness_max=1 if trained else None,
        staleness_mean=0.5 if trained else None, stale_groups=0, rollout_seconds=1.0, scoring_seconds=0.1,
        training_seconds=0.3 if trained else 0.0, push_seconds=0.1 if trained else 0.0, publish_seconds=None,
        blocked_seconds=1e-6, produced_at=1_700_000_000_000 + step)
    return journal.Entry(step=step, run_id=run_id, trained=trained, batch=batch, trajectories=trajectories,
                         evaluation={"event_id": f"e-{step}", "success_rate": 0.5} if step == 2 else None,
                         record=record, policy_version=step, trainer_updates=step, sampler=FRESH_POOL,
                         published=published,
                         policy_update={"event_id": f"p-{step}", "version": step} if trained else None)


def test_an_entry_reads_back_exactly(tmp_path):
    written = entry(2)
    path = journal.write(tmp_path, written)
    assert path == tmp_path / "journal" / "step-000002"
    assert journal.read(path) == written
    assert journal.read(journal.write(tmp_path, entry(3, trained=False))).batch == []


def test_the_record_as_sent_replaces_the_one_built_before_publishing(tmp_path):
    path = journal.write(tmp_path, entry(1))
    sent = entry(1).record.published(0.25)
    assert (sent.publish_seconds, sent.duration_seconds) == (0.25, 1.75)
    journal.mark_published(path, sent)
    found = journal.read(path)
    assert found.published and found.record == sent
    assert not any(p.name.endswith(".tmp") for p in path.iterdir())


def test_a_write_cut_short_before_its_rename_leaves_no_entry(tmp_path, monkeypatch):
    journal.write(tmp_path, entry(1))

    def crash(*_):
        raise OSError("killed before the rename")
    monkeypatch.setattr(journal.os, "replace", crash)
    with pytest.raises(OSError, match="killed before the rename"):
        journal.write(tmp_path, entry(2))
    monkeypatch.undo()
    assert (tmp_path / "journal" / "step-000002.tmp" / "batch.json").is_file()
    assert list(journal.complete(tmp_path)) == [1]
    assert journal.entries_after(tmp_path, 0) == [tmp_path / "journal" / "step-000001"]
    assert journal.read(journal.write(tmp_path, entry(2))) == entry(2)  # a later write replaces the leftover


def test_entries_after_a_step_run_up_to_the_first_gap(tmp_path):
    for step in (3, 4, 6):
        journal.write(tmp_path, entry(step))
    assert [p.name for p in journal.entries_after(tmp_path, 2)] == ["step-000003", "step-000004"]
    assert journal.entries_after(tmp_path, 4) == [] and journal.entries_after(tmp_path, 5)[0].name == "step-000006"
    assert journal.run_of(tmp_path) == "run-j" and journal.run_of(tmp_path / "none") is None


def test_a_checkpoint_prunes_the_entries_below_its_step_and_unfinished_writes(tmp_path):
    for step in (1, 2, 3):
        journal.write(tmp_path, entry(step))
    (tmp_path / "journal" / "step-000004.tmp").mkdir()
    journal.prune(tmp_path, 2)  # the checkpoint's own step stays, for a broker that lost it
    assert sorted(p.name for p in (tmp_path / "journal").iterdir()) == ["step-000002", "step-000003"]


def test_a_resume_sends_the_checkpoints_step_again_only_when_the_broker_lost_it(tmp_path):
    sent_one = entry(1).record.published(0.25)
    journal.mark_published(journal.write(tmp_path, entry(1)), sent_one)
    asked = []

    def lost(run_id, step):
        asked.append((run_id, step))
        return False

    producer = Producer()
    assert list(redo_journaled(tmp_path, 1, "run-j", CountingTrainer(), TaskPool(SEEDS, SamplerConfig()), producer,
                               lost)) == []  # nothing after the checkpoint to redo
    assert asked == [("run-j", 1)]
    assert [topic for topic, _ in producer.sent] == [TRAJECTORIES.name] * 2 + [POLICY.name, STEPS.name]
    assert producer.sent[-1][1] == sent_one.to_event()  # the record as it was sent, its id and time
    kept = Producer()
    assert list(redo_journaled(tmp_path, 1, "run-j", CountingTrainer(), TaskPool(SEEDS, SamplerConfig()), kept,
                               lambda run_id, step: True)) == [] and kept.sent == []


def test_a_journal_without_a_checkpoint_is_a_run_to_resume(tmp_path):
    journal.write(tmp_path, entry(1, run_id="run-crashed"))
    with pytest.raises(ConfigError, match="step journal of run run-crashed.*--resume"):
        run_to_continue(LearnerConfig(workdir=tmp_path))
    assert run_to_continue(LearnerConfig(workdir=tmp_path, resume=True)) == ("run-crashed", None)
    with pytest.raises(ConfigError, match="differs"):
        run_to_continue(LearnerConfig(workdir=tmp_path, resume=True, run_id="other"))


class CountingTrainer:
    """Records each batch it trains on and counts its updates, as `Trainer.update` does."""

    def __init__(self):
        self.updates = 0
        self.batches = []

    def update(self, batch):
        self.batches.append(list(batch))
        self.updates += 1
        return {"loss": 0.125 * (self.updates)}


class Producer:
    def __init__(self):
        self.sent = []

    def send(self, topic, record, key=None):
        self.sent.append((topic, record))

    def flush(self):
        pass


def replaying(tmp_path):
    service = Learner(LearnerSettings(LearnerConfig(workdir=tmp_path, resume=True, steps=5),
                                      backend=BackendConfig(model="tiny-random", backend="transformers")))
    service.trainer, service.producer = CountingTrainer(), Producer()
    service.pool = TaskPool(SEEDS, SamplerConfig(), rng_seed=3)
    return service


def test_a_resume_replays_each_journaled_step_and_sends_its_records_again(tmp_path, caplog):
    pool = TaskPool(SEEDS, SamplerConfig(), rng_seed=3)
    pool.sample(2)
    after_two = pool.state()
    sent_one = entry(1).record.published(0.25)
    journal.mark_published(journal.write(tmp_path, entry(1)), sent_one)
    journal.write(tmp_path, journal.Entry(**{**entry(2).__dict__, "sampler": after_two}))  # crashed mid-publish
    service = replaying(tmp_path)
    with caplog.at_level(logging.INFO, logger="coevolve.learner"):
        assert service._redo_journal() == 2
    assert service.done == 2 and service.trainer.updates == 2
    assert service.trainer.batches == [entry(1).batch, entry(2).batch]
    assert service.pool.state() == after_two == service.pool_state
    topics = [topic for topic, _ in service.producer.sent]
    assert topics == [TRAJECTORIES.name] * 2 + [POLICY.name, STEPS.name] + [TRAJECTORIES.name] * 2 + [
        POLICY.name, EVALUATIONS.name, STEPS.name]
    records = [r for _, r in service.producer.sent]
    assert records[:2] == entry(1).trajectories and records[3] == sent_one.to_event()
    assert records[2] == entry(1).policy_update and records[6] == entry(2).policy_update
    assert records[7] == entry(2).evaluation
    assert records[8]["publish_seconds"] > 0
    assert journal.read(tmp_path / "journal" / "step-000002").record.to_event() == records[8]
    assert records[8]["duration_seconds"] == 1.5 + records[8]["publish_seconds"]
    replayed = [r.fields for r in caplog.records if r.getMessage() == "learner.step_replayed"]
    assert [(f["step"], f["loss"], f["journaled_loss"]) for f in replayed] == [(1, 0.125, 0.125), (2, 0.25, 0.25)]


def test_a_replay_follows_the_checkpoint_and_refuses_a_journal_that_does_not(tmp_path):
    journal.write(tmp_path, journal.Entry(**{**entry(1, trained=False).__dict__, "trainer_updates": 0}))
    journal.write(tmp_path, journal.Entry(**{**entry(2).__dict__, "trainer_updates": 1}))
    service = replaying(tmp_path)
    assert service._redo_journal() == 2 and service.trainer.batches == [entry(2).batch]
    journal.write(tmp_path, entry(3))  # it claims three updates; only one was journaled before it
    again = replaying(tmp_path)
    with pytest.raises(RuntimeError, match="does not continue the checkpoint"):
        again._redo_journal()
