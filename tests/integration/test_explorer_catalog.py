"""`coevolve explorer` as a process resolves a signal on a task validated after it started: it reads
`coevolve.tasks` on when a signal names an id it does not know; only an id that resolves nowhere is
dead-lettered `no_task` (tiny-random on transformers writes no usable reflection, so a resolved task is
dead-lettered `unparseable_reflection` instead: the reflection was tried on it)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER, SIGNALS, STEPS, TASKS
from tests.integration.test_explorer_validator import FAST, MODEL, ONE_ATTEMPT, _command, _read
from tests.unit.test_explorer_reflection import boundary_signal
from tests.unit.test_explorer_subjects import CHILD_ID, _validated

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _wait_started(log: Path, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while "explorer.started" not in (log.read_text(errors="replace") if log.exists() else ""):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the explorer did not start"
        time.sleep(0.5)


@pytest.mark.timeout(600)
def test_a_signal_on_a_task_validated_after_the_start_resolves_and_an_unknown_id_is_no_task(bootstrap, tmp_path):
    log = tmp_path / "explorer.log"
    args = [*MODEL, *FAST, "--runs", "1", "--calls-per-run", "1", "--signals-per-step", "2", "--group-id", "cat"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(_command("explorer", bootstrap, args, 20), stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **ONE_ATTEMPT})
    try:
        _wait_started(log, proc)
        time.sleep(5)  # the catalog's first read is long done: this task can only come from a later one
        with EventProducer(bootstrap) as producer:
            record = {**_validated(), "event_id": "v-child", "run_id": "r1", "step": 3, "reason": "ok",
                      "signal_ids": [], "exploration_ids": [], "validation_score": 1.0, "stage": None,
                      "stages": [], "produced_at": 1_795_000_000_000}
            producer.send(TASKS.name, record, key=CHILD_ID)
            for i, task_id in enumerate((CHILD_ID, "synthesized_nowhere")):
                signal = {**boundary_signal(f"sig-{i}", 4, task_id), "run_id": "r1"}
                producer.send(SIGNALS.name, signal, key=task_id)
            producer.send(STEPS.name, {"event_id": "r1-step-4", "run_id": "r1", "step": 4, "trajectory_count": 3,
                                       "policy_version": 4, "train_reward": 0.5, "eval_success": None, "loss": 0.1,
                                       "duration_seconds": 1.0, "produced_at": 1_795_000_000_000}, key="r1")
            producer.flush()
        proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-3000:]
    dead = {d["key"].decode(): d for d in _read(bootstrap, DEADLETTER.name)
            if d["service"] == "explorer"}
    assert dead[CHILD_ID]["error_type"] == "unparseable_reflection", dead[CHILD_ID]["reason"]
    assert dead["synthesized_nowhere"]["error_type"] == "no_task"
    assert "not among the 1 validated tasks on coevolve.tasks" in dead["synthesized_nowhere"]["reason"]
