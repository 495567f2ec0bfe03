"""`coevolve explorer` and `coevolve validator` as processes, through the real broker, with tiny-random.

Real `SignalRaised` events for real BFCL tasks go in, then the `StepCompleted` that closes their period.
A random-weight model writes no usable reflection, so the signal-guided explorer dead-letters every
chosen cluster with the reason (and keeps running), then explores `fallback_tasks` seed tasks randomly.
The `random` strategy reads no model. Either way the validator turns each group of explorations into
one verdict (or a dead letter with the reason), and every task whose reference it ran replays from its
`TaskChecked` record exactly like a seed task.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.structs import TopicPartition

from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import score_calls
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER, EXPLORATIONS, SIGNALS, STEPS, TASKS
from coevolve.services.validator.abstraction import successful_calls
from coevolve.services.validator.stages import check_executable
from tests.unit.test_explorer_reflection import boundary_signal

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TASKS_USED = ("multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2")
MODEL = ["--model", "tiny-random", "--backend", "transformers", "--max-new-tokens", "24",
         "--json-max-new-tokens", "24"]
# Random weights never write parseable JSON without a grammar: one attempt shows it as well as three.
ONE_ATTEMPT = {"EXPLORER_PARSE_ATTEMPTS": "1", "VALIDATOR_PARSE_ATTEMPTS": "1"}
FAST = ["--step-grace", "1", "--metrics-port", "-1"]


def _publish_period(bootstrap: str, run_id: str = "r1", step: int = 4) -> list[str]:
    """One boundary signal per task at `step`, then the step's StepCompleted; the signal ids.

    The StepCompleted goes out right after the signals, so one poll often hands it over first: the
    explorer must still explore them (the period waits `step_grace_s`)."""
    signals = [{**boundary_signal(f"{run_id}-{step}-sig-{i}", step, task), "run_id": run_id}
               for i, task in enumerate(TASKS_USED)]
    with EventProducer(bootstrap) as producer:
        for record in signals:
            producer.send(SIGNALS.name, record, key=record["task_id"])
        producer.send(STEPS.name, {"event_id": f"{run_id}-step-{step}", "run_id": run_id, "step": step,
                                   "trajectory_count": 3, "policy_version": step, "train_reward": 0.5,
                                   "eval_success": None, "loss": 0.1, "duration_seconds": 1.0,
                                   "produced_at": 1_795_000_000_000}, key=run_id)
        producer.flush()
    return [s["event_id"] for s in signals]


def _command(name: str, bootstrap: str, args: list[str], idle_exit: float) -> list[str]:
    return [str(Path(sys.executable).with_name("coevolve")), name, "--bootstrap", bootstrap, *args,
            "--idle-exit", str(idle_exit)]


def _run(name: str, bootstrap: str, args: list[str], log: Path, timeout: float = 300,
         env: dict[str, str] | None = None) -> str:
    """Run `coevolve <name>` until it exits idle; its output. On a timeout, the process's threads'
    stacks (faulthandler, on SIGABRT) and its log's tail are the failure message."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(_command(name, bootstrap, args, 4), stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(10)
            pytest.fail(f"{name} still running after {timeout:.0f} s:\n{log.read_text()[-6000:]}")
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


def _read(bootstrap: str, topic: str) -> list[dict]:
    consumer = EventConsumer(bootstrap, [topic], service="test")
    try:
        return [item.event for item in consumer.drain(idle_s=2.0)]
    finally:
        consumer.close()


def _assert_one_verdict_per_group(explorations: list[dict], verdicts: list[dict], dead: list[dict]) -> None:
    groups: dict[tuple, list[dict]] = {}
    for e in explorations:
        groups.setdefault((e["run_id"], e["signal_id"] or f"random@{e['step']}", e["task_id"]), []).append(e)
    assert len(verdicts) + len(dead) == len(groups)  # every group: one verdict or one dead letter
    assert len({v["task_id"] for v in verdicts}) == len(verdicts)
    assert all(v["verdict"] in ("validated", "rejected") and v["stages"] and v["reason"] for v in verdicts)
    # a group with no explored call that succeeded has nothing to abstract; any other dead letter is a
    # proposal that never parsed
    empty = sum(not successful_calls(group) for group in groups.values())
    kinds = Counter(d["error_type"] for d in dead)
    assert kinds["nothing_to_abstract"] == empty and set(kinds) <= {"nothing_to_abstract", "unparseable_proposal"}
    assert all(d["reason"] for d in dead)
    used = [i for v in verdicts for i in v["exploration_ids"]]
    assert len(used) == len(set(used)) and set(used) <= {e["event_id"] for e in explorations}


def _assert_replays(verdicts: list[dict]) -> int:
    """Every task whose reference ran (validated, or past the executable stage) replays from its record:
    its reference runs again without errors and scores as a full solution. The count checked."""
    ran = [v for v in verdicts if v["verdict"] == "validated"
           or any(s["stage"] == "executable" and s["passed"] for s in v["stages"])]
    for record in ran:
        task = Task.from_record(record)
        assert check_executable(task).passed, record
        assert score_calls(task, [list(turn) for turn in task.reference])["success"], record
    return len(ran)


def _validate_and_check(bootstrap: str, tmp_path: Path, explorations: list[dict]) -> None:
    """Run the validator over the explorations; every group gets one verdict or dead letter, and every
    task whose reference ran replays."""
    _run("validator", bootstrap, [*MODEL, "--metrics-port", "-1", "--rounds-per-group", "2", "--group-id",
                                  "validator"], tmp_path / "validator.log", env=ONE_ATTEMPT)
    verdicts = _read(bootstrap, TASKS.name)
    dead = [d for d in _read(bootstrap, DEADLETTER.name) if d["service"] == "validator"]
    _assert_one_verdict_per_group(explorations, verdicts, dead)
    _assert_replays(verdicts)


def test_guided_reflections_that_never_parse_are_dead_lettered_then_the_fallback_explores(bootstrap, tmp_path):
    _publish_period(bootstrap)
    _run("explorer", bootstrap, [*MODEL, *FAST, "--runs", "2", "--calls-per-run", "2", "--signals-per-step",
                                 "2", "--fallback-tasks", "2", "--group-id", "guided"], tmp_path / "explorer.log",
         env=ONE_ATTEMPT)
    dead = [d for d in _read(bootstrap, DEADLETTER.name) if d["service"] == "explorer"]
    # two clusters chosen (signals_per_step), the third skipped: one dead letter per chosen signal
    assert len(dead) == 2 and {d["error_type"] for d in dead} == {"unparseable_reflection"}
    assert all(d["source_topic"] == SIGNALS.name and "no schema-valid JSON after 1 attempt(s)" in d["reason"]
               for d in dead)
    assert {d["key"].decode() for d in dead} <= set(TASKS_USED)
    explorations = _read(bootstrap, EXPLORATIONS.name)
    assert len(explorations) == 4 and len({e["event_id"] for e in explorations}) == 4  # 2 tasks x 2 runs
    assert {e["strategy"] for e in explorations} == {"random-fallback"}
    assert all(e["tuples"] and e["signal_id"] is None and e["step"] == 4 for e in explorations)

    _validate_and_check(bootstrap, tmp_path, explorations)


def test_random_call_explorations_reach_the_validator_and_each_proposal_gets_one_verdict(bootstrap, tmp_path):
    _publish_period(bootstrap)
    random_args = ["--strategy", "random-calls", "--runs", "2", "--calls-per-run", "3", "--signals-per-step", "2"]
    _run("explorer", bootstrap, [*random_args, *FAST, "--group-id", "random"], tmp_path / "explorer.log")
    explorations = _read(bootstrap, EXPLORATIONS.name)
    assert len(explorations) == 4 and len({e["event_id"] for e in explorations}) == 4
    assert {e["strategy"] for e in explorations} == {"random-calls"} and all(e["tuples"] for e in explorations)

    _validate_and_check(bootstrap, tmp_path, explorations)


def _committed_all(bootstrap: str, group: str) -> bool:
    """Whether the group's committed offsets cover every signal and step published so far."""
    consumer = EventConsumer(bootstrap, [SIGNALS.name, STEPS.name], service="test")
    try:
        ends: dict[TopicPartition, int] = {}
        for item in consumer.drain(idle_s=1.0):
            tp = TopicPartition(item.topic, item.partition)
            ends[tp] = max(ends.get(tp, 0), item.offset + 1)
    finally:
        consumer.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-offsets")
    try:
        committed = admin.list_group_offsets({group: list(ends)})[group]
    finally:
        admin.close()
    return bool(ends) and all(tp in committed and committed[tp].offset >= end for tp, end in ends.items())


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_killed_and_restarted_explorer_resumes_from_its_offsets_and_publishes_no_duplicate(bootstrap, tmp_path):
    args = ["--strategy", "random-calls", "--runs", "2", "--calls-per-run", "2", *FAST, "--group-id", "restart"]
    _publish_period(bootstrap, step=4)
    with open(tmp_path / "first.log", "wb") as out:
        first = subprocess.Popen(_command("explorer", bootstrap, args, 0), stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: len(_read(bootstrap, EXPLORATIONS.name)) == 8, 240, "the first period's explorations")
        _wait_for(lambda: _committed_all(bootstrap, "restart"), 30, "the first explorer's commit")
    finally:
        first.send_signal(signal.SIGKILL)  # no graceful stop: it resumes from what it committed
        first.wait(10)
    before = _read(bootstrap, EXPLORATIONS.name)
    _publish_period(bootstrap, step=5)
    _run("explorer", bootstrap, args, tmp_path / "second.log")
    after = _read(bootstrap, EXPLORATIONS.name)
    ids = [e["event_id"] for e in after]
    assert len(ids) == len(set(ids)) == 16  # 4 tasks (signals_per_step) x 2 runs per period, none twice
    assert {e["event_id"] for e in before} <= set(ids)
    assert sorted(e["step"] for e in after) == [4] * 8 + [5] * 8

