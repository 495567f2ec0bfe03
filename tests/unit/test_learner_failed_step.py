"""A step that fails after its update is never checkpointed under the previous step's number: `finish`
skips the checkpoint, and a resume replays the journal onto the last checkpoint instead, whether the
failed step reached the journal (publishing failed) or not (the weight push failed)."""
import logging

import pytest
import torch

from coevolve.services.agent.config import BackendConfig
from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.fleet.client import WeightTransferError
from coevolve.services.kafka.producer import DeliveryError
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, LearnerSettings, SamplerConfig
from coevolve.services.learner.loop import checkpoint as ckpt
from coevolve.services.learner.loop import journal
from coevolve.services.learner.loop.results import StepOutcome, Update
from coevolve.services.learner.loop.sampler import TaskPool
from coevolve.services.learner.loop import publish
from coevolve.services.learner.loop.service import Learner
from coevolve.services.learner.trainer.build import build_trainer
from bench.shapes import random_llama
from tests.unit.test_learner_journal_entries import entry

SEEDS = load_tasks(split="train")[:3]


def trainer():
    torch.manual_seed(0)
    model = random_llama("tiny", seed=0, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    return build_trainer(model, GRPOConfig(lr=1e-2))


class Backend:
    version = 0

    def close(self):
        pass


class Producer:
    """Confirms everything until `fail_from` sends, then reports the broker gone (for `outage` flushes, if
    given, then it is back)."""

    def __init__(self, fail_from: int | None = None, outage: int | None = None):
        self.sent, self.fail_from, self.outage, self.failed = [], fail_from, outage, 0

    def send(self, topic, record, key=None):
        self.sent.append((topic, record))

    def flush(self):
        if self.fail_from is not None and len(self.sent) >= self.fail_from and self.failed != self.outage:
            self.failed += 1
            raise DeliveryError("127.0.0.1:9", ["x"], "broker gone")

    def close(self):
        pass


class Runner:
    """Each step trains the trainer on its journaled batch, as the real step would; `fail` at `fail_step`
    after the update (a weight push that no server took)."""

    def __init__(self, service: Learner, fail_step: int | None = None):
        self.service, self.fail_step = service, fail_step

    def run(self, step):
        e = entry(step)
        self.service.trainer.update(e.batch)
        self.service.backend.version = step
        if step == self.fail_step:
            raise WeightTransferError("no server took the update")
        return StepOutcome(e.trajectories, e.record, Update({"loss": 0.1}, True), e.batch, e.sampler)

    def close(self):
        pass


def learner(workdir, resume=False) -> Learner:
    service = Learner(LearnerSettings(LearnerConfig(workdir=workdir, steps=5, checkpoint_every=10, resume=resume),
                                      backend=BackendConfig(model="tiny-random", backend="transformers")))
    service.trainer, service.backend = trainer(), Backend()
    service.pool = TaskPool(SEEDS, SamplerConfig(), rng_seed=3)
    return service


def weights(t) -> list[torch.Tensor]:
    return [p.detach().clone() for _, p in t.named_parameters()]


@pytest.mark.parametrize("failure", ["push", "publish"])
def test_a_step_failing_after_its_update_is_not_checkpointed_and_a_resume_replays_the_journal(tmp_path, failure,
                                                                                              caplog, monkeypatch):
    monkeypatch.setattr(publish, "PUBLISH_OUTAGE_S", 0.0)  # the broker does not come back in time
    service = learner(tmp_path)
    service.producer = Producer(fail_from=None if failure == "push" else 6)  # step 2's trajectories fail
    service.runner = Runner(service, fail_step=2 if failure == "push" else None)
    service.poll()
    after_one = weights(service.trainer)
    error = WeightTransferError if failure == "push" else DeliveryError
    with caplog.at_level(logging.WARNING, logger="coevolve.learner"), pytest.raises(error):
        service.poll()
    (failed,) = [r.fields for r in caplog.records if r.getMessage() == "learner.step_failed"]
    assert failed["step"] == 2 and failed["reason"].startswith(error.__name__) and "--resume" in failed["fix"]
    assert service.done == 1 and service.trainer.updates == 2
    with caplog.at_level(logging.WARNING, logger="coevolve.learner"):
        service.finish()
    assert ckpt.latest_checkpoint(tmp_path) is None  # not step 1's name on step 2's weights
    (skipped,) = [r.fields for r in caplog.records if r.getMessage() == "learner.checkpoint_skipped"]
    assert (skipped["step"], skipped["updates"], skipped["updates_at_step"]) == (1, 2, 1)
    journaled = [journal.read(path).step for path in journal.entries_after(tmp_path, 0)]
    assert journaled == ([1] if failure == "push" else [1, 2])

    resumed = learner(tmp_path, resume=True)
    resumed.producer = Producer()
    resumed._redo_journal()
    assert resumed.done == journaled[-1] and resumed.trainer.updates == len(journaled)
    if failure == "push":  # step 2 runs again from step 1's weights
        assert all(torch.equal(a, b) for a, b in zip(weights(resumed.trainer), after_one))


def test_a_step_failing_before_its_update_leaves_the_checkpoint_of_the_last_step(tmp_path):
    service = learner(tmp_path)
    service.producer = Producer()
    service.runner = Runner(service)
    service.poll()
    service.runner.run = lambda step: (_ for _ in ()).throw(WeightTransferError("rollouts failed"))
    with pytest.raises(WeightTransferError):
        service.poll()
    service.finish()
    found, fresh = ckpt.latest_checkpoint(tmp_path), trainer()
    ckpt.restore_trainer(fresh, found)
    assert found.step == 1 and fresh.updates == 1


def test_a_broker_outage_shorter_than_the_allowance_is_ridden_out_and_the_step_sent_once_it_is_back(
        tmp_path, monkeypatch, caplog):
    """A rolling restart of the broker outlasts the producer's delivery timeout (30 s): the learner sends the
    journaled step again, with the record the first attempt marked as sent, instead of ending."""
    monkeypatch.setattr(publish.time, "sleep", lambda s: None)
    service = learner(tmp_path)
    service.producer = Producer(fail_from=6, outage=2)  # step 2's trajectories, then its step record
    service.runner = Runner(service)
    service.poll()
    with caplog.at_level(logging.WARNING, logger="coevolve.learner"):
        service.poll()
    retries = [r.fields for r in caplog.records if r.getMessage() == "learner.publish_retry"]
    assert [(r["step"], r["retry_in_s"]) for r in retries] == [(2, 1.0), (2, 2.0)]
    assert not [r for r in caplog.records if r.getMessage() == "learner.step_failed"]
    assert service.done == 2 and journal.published_record(journal.entries_after(tmp_path, 1)[0]) is not None
    steps = [record for topic, record in service.producer.sent if topic == "coevolve.steps"]
    assert [s["step"] for s in steps] == [1, 2, 2]  # the attempt the broker lost, then the one it confirmed
    assert steps[1] == steps[2]  # the same record, publish time included: consumers absorb it by event id
