"""`coevolve run --preset smoke` end to end: the whole loop, its summary against the broker, a resume."""
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from coevolve.services.clickhouse.client import chdb_url, connect
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.topics import CATALOG
from tests.faults.scenario import inject_validated_task

pytestmark = [pytest.mark.integration, pytest.mark.slow]
EXE = str(Path(sys.executable).with_name("coevolve"))


@pytest.fixture()
def broker():
    with EmbeddedBroker() as embedded:
        yield embedded.bootstrap


def _events(bootstrap: str, run_id: str, dedupe: bool = True) -> dict[str, list[dict]]:
    """The run's events on the broker, by event name (each event id once unless `dedupe` is False)."""
    consumer = EventConsumer(bootstrap, list(CATALOG), service="test")
    try:
        out: dict[str, list[dict]] = {}
        for item in consumer.drain(idle_s=2.0):
            if item.event.get("run_id") in (run_id, None) or item.name == "TaskChecked":
                out.setdefault(item.name, []).append(item.event)
    finally:
        consumer.close()
    if dedupe:
        out = {name: list({e["event_id"]: e for e in events}.values()) for name, events in out.items()}
    return out


def _run(workdir: Path, bootstrap: str, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "run", "--preset", "smoke", "--workdir", str(workdir), "--bootstrap", bootstrap,
                           *extra], capture_output=True, text=True, timeout=timeout)


def test_smoke_runs_every_stage_and_its_summary_agrees_with_the_broker(tmp_path, broker):
    # A validated task already on coevolve.tasks: the learner's feed takes it in at a step boundary.
    injected = inject_validated_task(broker, "smoke-e2e")
    done = _run(tmp_path, broker, "--run-id", "smoke-e2e")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    stdout = done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    events = _events(broker, summary["run_id"])

    steps = sorted(e["step"] for e in events["StepCompleted"])
    assert steps == [1, 2, 3] and summary["steps"] == 3 and summary["state"] == "completed"
    trajectories = events["TrajectoryRecorded"]
    assert len(trajectories) == summary["trajectories"] == sum(e["trajectory_count"] for e in events["StepCompleted"])
    assert Counter(t["step"] for t in trajectories) == {1: 8, 2: 8, 3: 8}  # B = 2 tasks x K = 4 rollouts
    assert all(t["group_size"] == 4 for t in trajectories)
    for step in events["StepCompleted"]:
        assert f"step {step['step']}/3" in stdout

    # The policy is warmed before the services start, and the explorer and validator act with it.
    policy = next(line.split()[1] for line in stdout.splitlines() if line.startswith("policy "))
    assert "-warm-" in policy and summary["wall_seconds"]["warmup"] > 0
    for name in ("explorer", "validator"):
        assert f'"model": "{policy}"' in (tmp_path / "logs" / f"{name}.log").read_text()

    signals = Counter(e["kind"] for e in events.get("SignalRaised", []))
    assert summary["signals"] == {k: signals.get(k, 0) for k in ("forgetting", "boundary", "rare")}
    assert sum(signals.values()) > 0, summary["signals_silent"]  # the warmed-up policy acts
    assert set(summary["signals_silent"]) == {k for k, n in summary["signals"].items() if n == 0}
    trained = [e["step"] for e in events["StepCompleted"] if e["loss"] is not None]
    assert (summary["updates_silent"] is None) == bool(trained), summary["updates_silent"]
    explorations = Counter(e["strategy"] for e in events["ExplorationRecorded"])
    assert summary["explorations"] == dict(explorations) and sum(explorations.values()) > 0

    verdicts = {e["task_id"]: e for e in events.get("TaskChecked", []) if e["source"] == "synthesized"}
    assert summary["tasks_proposed"] == len(verdicts) and set(verdicts) - {injected["task_id"]}  # the run's own
    validated = sum(v["verdict"] == "validated" for v in verdicts.values())
    assert summary["tasks_validated"] == validated
    assert all(v["stage"] for v in verdicts.values() if v["verdict"] == "rejected")
    # The pool is the seed tasks plus exactly the validated tasks taken in between steps: the injected
    # one has joined by the last step, and the pool never shrinks.
    pool = {int(k): v for k, v in summary["pool_size"].items()}
    synthesized = {int(k): v for k, v in summary["pool_synthesized"].items()}
    assert {pool[s] - synthesized[s] for s in pool} == {16}
    assert injected["task_id"] in verdicts and synthesized[1] <= synthesized[2] <= synthesized[3]
    assert 1 <= synthesized[3] <= validated
    assert [e["step"] for e in events["EvaluationCompleted"]] == [3]

    client = connect(chdb_url(tmp_path), create=False)
    try:
        archived = client.query("SELECT count() FROM coevolve.trajectories FINAL").result_rows[0][0]
    finally:
        client.close()
    assert archived == len(trajectories)
    assert (tmp_path / "report" / "index.html").exists()


def test_an_interrupted_run_resumes_at_the_next_step(tmp_path, broker):
    # Longer generations and more steps than the preset, so the interrupt lands mid-run.
    cmd = [EXE, "run", "--preset", "smoke", "--workdir", str(tmp_path), "--bootstrap", broker, "--steps", "8",
           "--set", "learner.max_new_tokens=64", "--set", "learner.eval_every=0"]
    with open(tmp_path.parent / "first.log", "w+") as out:
        first = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 900  # the first run on a machine warms the policy up first
        while "step 1/8" not in Path(out.name).read_text() and time.monotonic() < deadline:
            assert first.poll() is None, Path(out.name).read_text()[-4000:]
            time.sleep(0.5)
        first.send_signal(signal.SIGINT)
        assert first.wait(300) == 130, Path(out.name).read_text()[-4000:]
    interrupted = json.loads((tmp_path / "summary.json").read_text())
    assert interrupted["state"] == "interrupted" and 1 <= interrupted["last_step"] < 8

    done = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    resumed = json.loads((tmp_path / "summary.json").read_text())
    assert resumed["run_id"] == interrupted["run_id"] and resumed["resumed"]
    # Every step published once: a resume that started over would publish step 1 again.
    steps = Counter(e["step"] for e in _events(broker, resumed["run_id"], dedupe=False)["StepCompleted"])
    assert steps == {step: 1 for step in range(1, 9)}
    assert f"step {interrupted['last_step'] + 1}/8" in done.stdout
