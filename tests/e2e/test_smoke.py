"""One `coevolve run --preset smoke` for the whole module, on the rollout fleet with bounded staleness
(`learner.backend=vllm-server`, `max_policy_lag=1`): the learner starts a `vllm serve` process, rolls out
on it over HTTP, pushes every update through vLLM's weight-transfer API and generates each next step's
rollouts while a step trains. Each test reads one facet of that run from its stdout, summary, workdir,
archive, the broker's log and the sockets its processes listened on."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from coevolve.services.kafka.embedded import EmbeddedBroker
from tests.e2e.runs import EXE, events, trained_steps
from tests.sockets import listening_sockets
from tests.faults.scenario import inject_validated_task

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RUN_ID = "smoke-e2e"
STEPS = 3


@dataclass
class Smoke:
    workdir: Path
    stdout: str
    summary: dict
    events: dict[str, list[dict]]
    injected: dict
    listening: set[tuple[str, int, str]]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Smoke:
    workdir = tmp_path_factory.mktemp("smoke")
    with EmbeddedBroker() as broker:
        # A validated task already on coevolve.tasks: the learner's feed takes it in at a step boundary.
        injected = inject_validated_task(broker.bootstrap, RUN_ID)
        cmd = [EXE, "run", "--preset", "smoke", "--workdir", str(workdir), "--bootstrap", broker.bootstrap,
               "--run-id", RUN_ID, "--set", "learner.backend=vllm-server", "--set", "learner.max_policy_lag=1"]
        stdout, stderr = (workdir.parent / f"{workdir.name}.{name}" for name in ("out", "err"))
        listening: set[tuple[str, int, str]] = set()
        with open(stdout, "w") as out, open(stderr, "w") as err:
            run = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
            deadline = time.monotonic() + 840
            while run.poll() is None and time.monotonic() < deadline:  # every socket the run's tree listens on
                listening |= listening_sockets(run.pid)
                time.sleep(1.0)
            run.kill()
        assert run.wait() == 0, stdout.read_text()[-4000:] + stderr.read_text()[-4000:]
        found = events(broker.bootstrap, RUN_ID)
    return Smoke(workdir, stdout.read_text(), json.loads((workdir / "summary.json").read_text()), found, injected,
                 listening)


@pytest.mark.timeout(900)
def test_every_step_completes_once_and_the_summary_counts_what_the_broker_holds(smoke):
    steps = sorted(e["step"] for e in smoke.events["StepCompleted"])
    assert steps == [1, 2, 3] and smoke.summary["steps"] == STEPS and smoke.summary["state"] == "completed"
    trajectories = smoke.events["TrajectoryRecorded"]
    assert len(trajectories) == smoke.summary["trajectories"] == sum(
        e["trajectory_count"] for e in smoke.events["StepCompleted"])
    # B = 2 tasks x K = 4 rollouts, and K more for each group dynamic sampling drew to replace a flat one
    assert Counter(t["step"] for t in trajectories) == {
        e["step"]: 4 * (2 + e["resampled_groups"]) for e in smoke.events["StepCompleted"]}
    assert all(t["group_size"] == 4 for t in trajectories)
    for step in smoke.events["StepCompleted"]:
        assert f"step {step['step']}/3" in smoke.stdout


@pytest.mark.timeout(900)
def test_every_step_trains(smoke):
    # The smoke preset's warmed policy and shaped reward make groups that score unlike, and its dynamic
    # sampling redraws the flat ones, so every step trains and the assertions on updates, pushes and
    # versions below check real updates.
    assert trained_steps(smoke.events) == [1, 2, 3], smoke.summary["updates_silent"]
    assert smoke.summary["updates_silent"] is None


@pytest.mark.timeout(900)
def test_the_policy_is_warmed_before_the_services_start_and_they_act_with_it(smoke):
    policy = next(line.split()[1] for line in smoke.stdout.splitlines() if line.startswith("policy "))
    assert "-warm-" in policy and smoke.summary["wall_seconds"]["warmup"] > 0
    for name in ("explorer", "validator"):
        assert f'"model": "{policy}"' in (smoke.workdir / "logs" / f"{name}.log").read_text()


@pytest.mark.timeout(900)
def test_signals_and_explorations_in_the_summary_are_the_brokers(smoke):
    signals = Counter(e["kind"] for e in smoke.events.get("SignalRaised", []))
    summary = smoke.summary
    assert summary["signals"] == {k: signals.get(k, 0) for k in ("forgetting", "boundary", "rare")}
    assert sum(signals.values()) > 0, summary["signals_silent"]  # the warmed-up policy acts
    assert set(summary["signals_silent"]) == {k for k, n in summary["signals"].items() if n == 0}
    explorations = Counter(e["strategy"] for e in smoke.events["ExplorationRecorded"])
    assert summary["explorations"] == dict(explorations) and sum(explorations.values()) > 0


@pytest.mark.timeout(900)
def test_every_proposal_has_a_verdict_and_the_pool_grows_by_the_validated_tasks(smoke):
    summary, injected = smoke.summary, smoke.injected
    verdicts = {e["task_id"]: e for e in smoke.events.get("TaskChecked", []) if e["source"] == "synthesized"}
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
    assert [e["step"] for e in smoke.events["EvaluationCompleted"]] == [3]


@pytest.mark.timeout(900)
def test_each_update_is_pushed_to_the_fleet_with_the_next_version(smoke):
    summary = smoke.summary
    assert summary["rollout"] == "vllm-server"
    updates = smoke.events.get("PolicyUpdated", [])
    assert len(updates) == len(trained_steps(smoke.events)) == summary["weight_updates"]["count"] == STEPS
    assert sorted(u["version"] for u in updates) == list(range(1, len(updates) + 1))
    assert all(u["backend"] == "vllm-server" and u["servers"] == 1 and u["bytes"] > 0 for u in updates)


@pytest.mark.timeout(900)
def test_every_rollout_is_within_one_version_of_the_policy_its_step_updated(smoke):
    steps = {e["step"]: e for e in smoke.events["StepCompleted"]}
    for t in smoke.events["TrajectoryRecorded"]:  # the policy each step updated, less the one that made a rollout
        step = steps[t["step"]]
        updated = step["policy_version"] - (step["loss"] is not None)
        assert 0 <= updated - t["policy_version"] <= 1, (t["step"], t["policy_version"], step["policy_version"])
    assert smoke.summary["policy_lag"]["max"] in (0, 1)


def _archive_counts(workdir: Path) -> dict[str, int]:
    """Rows of the archive's tables (chdb opens one path per process: a child reads it)."""
    code = ("import json, sys; from coevolve.services.clickhouse.client import chdb_url, connect; "
            "c = connect(chdb_url(sys.argv[1]), create=False); "
            "print(json.dumps({t: c.query(f'SELECT count() FROM coevolve.{t} FINAL').result_rows[0][0] "
            "for t in ('trajectories', 'policy_updates')})); c.close()")
    out = subprocess.run([sys.executable, "-c", code, str(workdir)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.timeout(900)
def test_the_archive_holds_every_trajectory_and_push_and_the_report_is_written(smoke):
    assert _archive_counts(smoke.workdir) == {"trajectories": len(smoke.events["TrajectoryRecorded"]),
                                              "policy_updates": len(smoke.events.get("PolicyUpdated", []))}
    assert (smoke.workdir / "report" / "index.html").exists()


@pytest.mark.timeout(900)
def test_every_socket_the_runs_processes_listen_on_is_on_loopback(smoke):
    # the broker is the test's; the run's own: services' health ports, the model server, the weight
    # transfer's store and process group
    assert smoke.listening, "no listening socket was seen"
    assert {(address, port, command) for address, port, command in smoke.listening
            if address not in ("127.0.0.1", "::1")} == set()
