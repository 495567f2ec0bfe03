"""Resuming: the run a workdir holds (`run_to_continue`), and the redo of its step journal (`journal.py`)
after the checkpoint the learner restored.

Event ids derive from (run, step, task, rollout), and consumers keep the first copy of an id, so a step
that published before a crash must never be re-run: its rollouts and update would differ from what was
published. `--resume` restores the latest checkpoint c and then redoes every journal entry c+1..k in
order, without rollouts: the same `update` on the journaled batch (so the weights, the optimizer state
and the trainer's update count follow the path they took, with DeepSpeed and LoRA alike), the pool's
state after the step, and the step's records sent again as journaled (same ids and content, which also
completes a publish the crash cut short; the evaluation is sent as it was, never re-run). The service
then pushes the weights to the rollout backend once, after the last entry, with the policy version that
entry recorded; training continues at k+1. Step c's own entry is kept too: when the broker lacks c's
StepCompleted (an embedded broker restored from an archive that had not yet stored it), c's records are
sent again first, as journaled. A step that crashed before its entry was renamed into place
published nothing and is run afresh. Without a checkpoint, the redo starts from the starting weights.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from coevolve.services.learner.config import LearnerConfig
from coevolve.services.learner.loop import checkpoint as ckpt
from coevolve.services.learner.loop import journal
from coevolve.services.learner.loop.publish import publish_step
from coevolve.services.learner.loop.sampler import TaskPool
from coevolve.services.runtime.config import ConfigError
from coevolve.services.runtime.log import get_logger

log = get_logger("learner")


def redo_journaled(workdir: Path, done: int, run_id: str, trainer: Any, pool: TaskPool, producer: Any,
                   on_log: Callable[[str, int], bool] | None = None) -> Iterator[tuple[journal.Entry, float | None]]:
    """Send step `done`'s journaled records again when `on_log` says the broker lacks its StepCompleted;
    then replay the journal's entries after step `done`; yield each entry, once replayed, with the loss of
    its update again (None when it did not train)."""
    kept = journal.complete(workdir).get(done)
    if kept is not None and on_log is not None and not on_log(run_id, done):
        entry = journal.read(kept)
        publish_step(producer, run_id, kept, entry.trajectories, [entry.evaluation, entry.subjects], entry.record,
                     published=entry.published, policy_update=entry.policy_update)
    for path in journal.entries_after(workdir, done):
        entry = journal.read(path)
        if entry.run_id != run_id:
            raise ConfigError(f"{path} is a step of run {entry.run_id}, not of {run_id}; move the "
                              "journal away, or choose another --workdir")
        loss = trainer.update(entry.batch)["loss"] if entry.trained else None
        if trainer.updates != entry.trainer_updates:
            raise RuntimeError(f"{path} was journaled after trainer update {entry.trainer_updates}, its replay "
                               f"reached {trainer.updates}: the journal does not continue the checkpoint")
        pool.restore(entry.sampler)
        publish_step(producer, run_id, path, entry.trajectories, [entry.evaluation, entry.subjects], entry.record,
                     published=entry.published, policy_update=entry.policy_update)
        yield entry, loss


def step_on_log(bootstrap: str) -> Callable[[str, int], bool]:
    """Whether the broker holds a run's StepCompleted of a step (coevolve.steps read to its end)."""

    def on_log(run_id: str, step: int) -> bool:
        from coevolve.services.kafka.consumer import EventConsumer, ReadShort
        from coevolve.services.kafka.topics import STEPS

        consumer = EventConsumer(bootstrap, [STEPS.name], service="learner-resume")
        try:
            read = consumer.read_to_end(30.0, complete=True)
        except ReadShort as exc:  # not known: nothing is sent again
            log.warning("learner.step_unchecked", step=step, error=str(exc))
            return True
        finally:
            consumer.close()
        return any(item.name == "StepCompleted" and item.event["run_id"] == run_id and int(item.event["step"]) == step
                   for item in read)

    return on_log


def run_to_continue(cfg: LearnerConfig) -> tuple[str, ckpt.Checkpoint | None]:
    """The run id and the checkpoint to continue from; refuse to overwrite a run without --resume. A
    journal without a checkpoint (a crash before the first one) is a run to resume too."""
    found = ckpt.latest_checkpoint(cfg.workdir)
    journaled = journal.run_of(cfg.workdir) if found is None else None
    existing = found.run_id if found is not None else journaled
    if existing is not None and not cfg.resume:
        holds = (f"a checkpoint of run {found.run_id} at step {found.step}" if found is not None
                 else f"a step journal of run {journaled}")
        raise ConfigError(f"{cfg.workdir} holds {holds}; pass --resume to continue it, or choose another --workdir")
    if existing is not None:
        if cfg.run_id and cfg.run_id != existing:
            raise ConfigError(f"--run-id {cfg.run_id} differs from the run {existing} in {cfg.workdir}; "
                              "drop --run-id to resume it")
        return existing, found
    return cfg.run_id or datetime.now(timezone.utc).strftime("run-%Y%m%dT%H%M%SZ"), None
