"""What the learner sends to the broker: a step's records, in the order consumers rely on, and the dead
letters of the tasks the pool refused.

A step's trajectories go first, confirmed by the broker; then its `PolicyUpdated`, its evaluations
(held-out, subjects) and its `StepCompleted`. A replayed step sends the records its journal entry holds
(`resume.py`), the very ones a consumer may already have; so does a step sent again through a broker
outage (`publish_journaled`).

Unloadable tasks. A task whose episode cannot start (BFCL's `InvalidTask`) is refused by the pool when
it arrives, or dropped when first drawn and replaced by another draw (sampler.py); the learner
dead-letters an arrival (`task_unloadable` on coevolve.deadletter, the TaskChecked bytes kept), logs
`learner.task_unloadable`, counts `learner_tasks_unloadable`, and trains on.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from coevolve.services.kafka.producer import DeliveryError
from coevolve.services.kafka.topics import DEADLETTER, EVALUATIONS, POLICY, STEPS, TRAJECTORIES
from coevolve.services.learner.loop import journal
from coevolve.services.learner.loop.record import StepRecord
from coevolve.services.learner.loop.sampler import Unloadable
from coevolve.services.runtime.log import get_logger

log = get_logger("learner")
PUBLISH_OUTAGE_S = 120.0  # how long a step's publishing rides out an unreachable broker before the learner ends


def publish_step(producer: Any, run_id: str, path: Path, trajectories: list[dict[str, Any]],
                 evaluations: list[dict[str, Any] | None], record: StepRecord, published: bool = False,
                 started: float | None = None, policy_update: dict[str, Any] | None = None) -> StepRecord:
    """Trajectories first, confirmed; then the policy update, the evaluations (held-out, subjects) and
    the step record, which is returned.

    A step record not sent before gets its publish time (since `started`: the journal write
    counts) and is kept in the journal entry at `path` before it is sent, so a replay sends this
    one; a record `published` before is sent as it is."""
    started = time.perf_counter() if started is None else started
    for trajectory in trajectories:
        producer.send(TRAJECTORIES.name, trajectory, key=trajectory["task_id"])
    producer.flush()
    if not published:
        record = record.published(time.perf_counter() - started)
        journal.mark_published(path, record)
    if policy_update is not None:
        producer.send(POLICY.name, policy_update, key=run_id)
    for evaluation in evaluations:
        if evaluation is not None:
            producer.send(EVALUATIONS.name, evaluation, key=run_id)
    producer.send(STEPS.name, record.to_event(), key=run_id)
    producer.flush()
    return record


def publish_journaled(producer: Any, run_id: str, path: Path, trajectories: list[dict[str, Any]],
                      evaluations: list[dict[str, Any] | None], record: StepRecord, started: float,
                      policy_update: dict[str, Any] | None, beat: Callable[[], None]) -> StepRecord:
    """`publish_step` for the step journaled at `path`, riding out a broker outage (a rolling restart) for
    `PUBLISH_OUTAGE_S`: the step's records are sent again, with the step record a first attempt marked
    as sent, and consumers absorb what they hold by event id. `beat` keeps /healthz live meanwhile. Past
    the allowance the DeliveryError is raised."""
    deadline, wait_s = time.monotonic() + PUBLISH_OUTAGE_S, 1.0
    while True:
        sent = journal.published_record(path)
        try:
            return publish_step(producer, run_id, path, trajectories, evaluations, sent or record,
                                published=sent is not None, started=started, policy_update=policy_update)
        except DeliveryError as failed:
            if time.monotonic() + wait_s > deadline:
                raise
            log.warning("learner.publish_retry", step=record.step, undelivered=len(failed.undelivered),
                        retry_in_s=wait_s, error=str(failed)[:300])
            for _ in range(int(wait_s / 0.5)):
                time.sleep(0.5)
                beat()
            wait_s = min(2 * wait_s, 15.0)


def publish_evaluation(producer: Any, run_id: str, evaluation: dict[str, Any]) -> None:
    """An evaluation outside any step (the starting policy's, as step 0), confirmed."""
    producer.send(EVALUATIONS.name, evaluation, key=run_id)
    producer.flush()


def report_unloadable(pool: Any, producer: Any, telemetry: Any, log: Any, service: str) -> None:
    """Dead-letter (an arrival from coevolve.tasks), log and count each task the pool refused or dropped."""
    with pool.guard:
        unloadable = pool.take_unloadable()
    sent = False
    for bad in unloadable:
        telemetry.unloadable.inc()
        log.warning("learner.task_unloadable", task_id=bad.task_id, reason=bad.reason,
                    dead_lettered=bad.origin is not None)
        sent = dead_letter(producer, bad, service) or sent
    if sent:
        producer.flush()


def dead_letter(producer: Any, bad: Unloadable, service: str) -> bool:
    """Send an unloadable arrival from coevolve.tasks to coevolve.deadletter (`task_unloadable`, the
    TaskChecked bytes kept), unflushed; False for a seed or restored task, which has no event to send."""
    from coevolve.services.kafka.consumer import dead_letter as letter

    if bad.origin is None:
        return False
    where = bad.origin
    payload = producer.registry.encode("TaskChecked", bad.record)
    producer.send(DEADLETTER.name, letter(where.topic, where.partition, where.offset, where.key, payload,
                                          "task_unloadable", bad.reason, service), key=where.topic)
    return True
