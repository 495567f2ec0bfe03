"""`coevolve explorer` and `coevolve validator` as processes, through the real broker, with tiny-random.

Real `SignalRaised` events for real BFCL tasks go in, then the `StepCompleted` that closes their period.
A random-weight model writes no usable reflection, so the signal-guided explorer dead-letters every
cluster with the reason (and keeps running); the `random` strategy reads no model and publishes
explorations, which the validator turns into proposals (or dead letters) and verdicts.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER, EXPLORATIONS, SIGNALS, STEPS, TASKS
from tests.unit.test_explorer_reflection import boundary_signal

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TASKS_USED = ("multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2")
MODEL = ["--model", "tiny-random", "--backend", "transformers", "--max-new-tokens", "24"]


def _publish_period(bootstrap: str, run_id: str = "r1", step: int = 4) -> list[str]:
    """One boundary signal per task at `step`, then the step's StepCompleted; the signal ids."""
    signals = [{**boundary_signal(f"{run_id}-sig-{i}", step, task), "run_id": run_id}
               for i, task in enumerate(TASKS_USED)]
    with EventProducer(bootstrap) as producer:
        for record in signals:
            producer.send(SIGNALS.name, record, key=record["task_id"])
        producer.flush()
        producer.send(STEPS.name, {"event_id": f"{run_id}-step-{step}", "run_id": run_id, "step": step,
                                   "trajectory_count": 3, "policy_version": step, "train_reward": 0.5,
                                   "eval_score": None, "loss": 0.1, "duration_seconds": 1.0,
                                   "produced_at": 1_795_000_000_000}, key=run_id)
    return [s["event_id"] for s in signals]


def _run(name: str, bootstrap: str, args: list[str], log: Path, timeout: float = 150) -> str:
    """Run `coevolve <name>` until it exits idle; its output."""
    cmd = [str(Path(sys.executable).with_name("coevolve")), name, "--bootstrap", bootstrap, *args,
           "--idle-exit", "4", "--metrics-port", "-1"]
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


def _read(bootstrap: str, topic: str) -> list[dict]:
    consumer = EventConsumer(bootstrap, [topic], service="test")
    try:
        return [item.event for item in consumer.drain(idle_s=2.0)]
    finally:
        consumer.close()


def test_unparseable_reflections_are_dead_lettered_with_reasons_and_nothing_crashes(bootstrap, tmp_path):
    _publish_period(bootstrap)
    _run("explorer", bootstrap, [*MODEL, "--runs", "2", "--calls-per-run", "2", "--signals-per-step", "2",
                                 "--group-id", "guided"], tmp_path / "explorer.log")
    assert _read(bootstrap, EXPLORATIONS.name) == []
    dead = [d for d in _read(bootstrap, DEADLETTER.name) if d["service"] == "explorer"]
    # two clusters chosen (signals_per_step), the third skipped: one dead letter per chosen signal
    assert len(dead) == 2 and {d["error_type"] for d in dead} == {"unparseable_reflection"}
    assert all(d["source_topic"] == SIGNALS.name and "no schema-valid JSON after 3 attempt(s)" in d["reason"]
               for d in dead)
    assert {d["key"].decode() for d in dead} <= set(TASKS_USED)


def test_random_explorations_reach_the_validator_and_each_proposal_gets_one_verdict(bootstrap, tmp_path):
    _publish_period(bootstrap)
    random_args = ["--strategy", "random", "--runs", "2", "--calls-per-run", "3", "--signals-per-step", "2"]
    _run("explorer", bootstrap, [*random_args, "--group-id", "random"], tmp_path / "explorer.log")
    explorations = _read(bootstrap, EXPLORATIONS.name)
    assert len(explorations) == 4 and len({e["event_id"] for e in explorations}) == 4
    assert {e["strategy"] for e in explorations} == {"random"} and all(e["tuples"] for e in explorations)

    _run("validator", bootstrap, [*MODEL, "--rounds-per-group", "2", "--group-id", "validator"],
         tmp_path / "validator.log")
    verdicts = _read(bootstrap, TASKS.name)
    dead = [d for d in _read(bootstrap, DEADLETTER.name) if d["service"] == "validator"]
    groups = {(e["run_id"], e["task_id"]) for e in explorations}
    assert len(verdicts) + len(dead) == len(groups) == 2  # every group: one verdict or one dead letter
    assert len({v["task_id"] for v in verdicts}) == len(verdicts)
    assert all(v["verdict"] in ("validated", "rejected") and v["stages"] for v in verdicts)
    assert all(d["error_type"] == "unparseable_proposal" and d["reason"] for d in dead)


def test_a_restarted_explorer_resumes_from_its_committed_offsets_and_republishes_nothing(bootstrap, tmp_path):
    _publish_period(bootstrap)
    args = ["--strategy", "random", "--runs", "2", "--calls-per-run", "2", "--group-id", "restart"]
    _run("explorer", bootstrap, args, tmp_path / "first.log")
    first = _read(bootstrap, EXPLORATIONS.name)
    _run("explorer", bootstrap, args, tmp_path / "second.log")  # resumes from the committed offsets
    again = _read(bootstrap, EXPLORATIONS.name)
    assert first and [e["event_id"] for e in again] == [e["event_id"] for e in first]
