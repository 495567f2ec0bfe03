"""The fault-injection run: `coevolve run --preset smoke` on the rollout fleet while the validator, the
explorer, the signal worker and the learner are each SIGKILLed once where a crash costs the most, the
fleet's server is SIGKILLed during a push, the broker is unreachable from the learner for longer than
its producer's retries while it publishes a step, the explorer starts on a backlog of closed periods,
one dual-pass call of the validator would compute for minutes, the run's embedded broker is SIGKILLed
mid-run, the learner's and the validator's tool hosts are SIGKILLed while idle, and the validator's
catalog read after its restart finds no partition (`sitecustomize.py`); and the checks, run on the run's log as the
archive kept it (put back on a broker of the checking process), that the broker came back with the
log, that no seed task was dropped nor proposal rejected for a dead host, and
that nothing was lost or counted twice, that each update was applied once, that the learner stopped
with a message at the failed push and resumed, that it rode out the outage by publishing the step
again, and that the call was stopped at its limit.
`tests/e2e/test_faults.py` runs it once; `python -m bench.bench_faults --repeats N` runs it N times and
counts the runs that pass.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from coevolve.services.archive.restore import restore_log
from coevolve.services.clickhouse.client import chdb_url, connect
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.producer import DELIVERY_TIMEOUT_S, EventProducer
from coevolve.services.kafka.topics import (CATALOG, EXPLORATIONS, SIGNALS, STEPS, TASKS, TRAJECTORIES,
                                             create_topics)
from coevolve.services.learner.loop.checkpoint import latest_checkpoint
from coevolve.services.validator.verdict import verdict_id
from tests.faults.sitecustomize import BACKLOG, OUTAGE_STEP

FAULTS = ("validator", "explorer", "streams", "learner")  # each SIGKILLed once
FAILED_STEPS = ("fleet",)  # each ends the learner with a message, and the run resumes it
HOSTS = ("host-learner", "host-validator")  # each process's tool host SIGKILLed while idle
OTHERS = FAILED_STEPS + HOSTS + ("outage", "backlog", "stall", "broker", "catalog")
# The dual pass with the stalled call: at least the tool host's limit (call_limit_s, 10 s), at most that
# and a new host with its replays.
STALL_S = (9.0, 60.0)
HERE = Path(__file__).resolve().parent
EXE = str(Path(sys.executable).with_name("coevolve"))
GARBAGE = b"garbage, not an Avro single-object event"
MARGIN = timedelta(seconds=10)  # a verdict this long before a step began was in the learner's pool for it
UNLOADABLE = "synthesized_unloadable"  # the id of the validated task whose initial state cannot load


@dataclass
class Outcome:
    """One fault-injection run: what it printed, which faults fired, and every check that failed."""

    returncode: int
    output: str
    fired: list[str]
    problems: list[str]

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.problems


def validated_task(run_id: str) -> dict:
    """A `TaskChecked` the validator's real stages passed (a scripted model proposes and solves it: a
    tiny policy rarely writes a task it can then solve), as the run's validator would publish it."""
    from tests.unit.test_validator_service import CALLS, PROPOSAL, _backend, _check

    checked, _ = _check(_backend(json.dumps(PROPOSAL), "[" + ", ".join(CALLS) + "]"))
    assert checked.record["verdict"] == "validated"
    return {**checked.record, "run_id": run_id}


def inject_validated_task(bootstrap: str, run_id: str) -> dict:
    """Put a validated `TaskChecked` on coevolve.tasks before the run, so the pool has a task to keep."""
    record = validated_task(run_id)
    create_topics(bootstrap)
    with EventProducer(bootstrap, client_id="faults") as producer:
        producer.send(TASKS.name, record, key=record["task_id"])
    return record


def inject_bad_input(bootstrap: str, run_id: str) -> str:
    """Garbage on every topic, a `TaskChecked` on coevolve.explorations, and a validated task whose initial
    state cannot load on coevolve.tasks; return that task's id."""
    good = validated_task(run_id)
    state = json.loads(good["initial_state"])
    task_id = UNLOADABLE
    unloadable = {**good, "task_id": task_id, "event_id": verdict_id(task_id, "validated"),
                  "initial_state": json.dumps({**state, "GorillaFileSystem": {"root": 5}})}
    with EventProducer(bootstrap, client_id="faults") as producer:
        for topic in CATALOG:
            producer.send_raw(topic, GARBAGE, key=b"garbage", event_id=f"garbage-{topic}")
        producer.send(EXPLORATIONS.name, good, key=good["task_id"], record_name="TaskChecked")
        producer.send(TASKS.name, unloadable, key=unloadable["task_id"])
    return unloadable["task_id"]


def inject(bootstrap: str, run_id: str) -> None:
    """The scenario's input, put on the run's broker before any service starts (by the run process,
    `sitecustomize.run_loop`): a validated task, and bad input on every topic."""
    inject_validated_task(bootstrap, run_id)
    inject_bad_input(bootstrap, run_id)


def run(workdir: Path, run_id: str, timeout_s: float = 1500) -> Outcome:
    """`coevolve run --preset smoke` on its embedded broker with every fault armed; then, on its log put back
    from the archive on a broker of this process's own, every check."""
    faults = workdir / "faults"
    faults.mkdir(parents=True, exist_ok=True)
    path = [str(HERE), str(HERE.parent.parent), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "COEVOLVE_FAULTS": str(faults), "PYTHONPATH": os.pathsep.join(filter(None, path))}
    done = subprocess.run([EXE, "run", "--preset", "smoke", "--workdir", str(workdir), "--run-id", run_id,
                           "--set", "learner.backend=vllm-server"],
                          capture_output=True, text=True, timeout=timeout_s, env=env)
    output = done.stdout + done.stderr
    fired = sorted(p.name for p in faults.iterdir())
    if done.returncode != 0:
        return Outcome(done.returncode, output, fired, [f"coevolve run exited with {done.returncode}"])
    with EmbeddedBroker() as broker:
        client = connect(chdb_url(workdir), create=False)
        try:
            restore_log(client, "coevolve", run_id, broker.bootstrap)
        finally:
            client.close()
        return Outcome(done.returncode, output, fired, check(workdir, broker.bootstrap, run_id, fired, UNLOADABLE,
                                                             output))


def _restarts(summary: dict, fired: list[str]) -> list[str]:
    """A restart after each kill, one of the learner after each failed step, one of the validator after
    its short catalog read, the broker's once, and no other."""
    restarts = summary["restarts"]
    problems = [f"unplanned restart: {r}" for r in restarts if r["cause"] != "exit"]
    services = [r for r in restarts if r["service"] != "broker"]
    killed = [r["service"] for r in services if r["cause"] == "exit" and r["exit_code"] == -9]
    failed = [r["service"] for r in services if r["cause"] == "exit" and r["exit_code"] != -9]
    if sorted(killed) != sorted(name for name in FAULTS if name in fired):
        problems.append(f"summary.json lists restarts after a SIGKILL of {sorted(killed)}, expected one of each "
                        f"killed service of {list(FAULTS)}")
    expected = ["learner"] * sum(name in fired for name in FAILED_STEPS) + ["validator"] * ("catalog" in fired)
    if sorted(failed) != sorted(expected):
        problems.append(f"restarted after a failure: {failed}, expected {expected} (the learner once for each of "
                        f"{list(FAILED_STEPS)}, the validator after its short catalog read)")
    brokers = [r for r in restarts if r["service"] == "broker"]
    if len(brokers) != ("broker" in fired) or any(r["exit_code"] != -9 for r in brokers):
        problems.append(f"the broker's restarts: {brokers}, expected one after its SIGKILL")
    return problems


def _hosts(workdir: Path, log: dict, output: str, run_id: str) -> list[str]:
    """A tool host killed while idle was replaced before the next request: no seed task dropped, no
    proposal rejected for it; and the broker's death brought back the run's log."""
    problems = []
    for fault in HOSTS:
        service = fault.split("-", 1)[1]
        text = (workdir / "logs" / f"{service}.log").read_text(errors="replace")
        if (workdir / "faults" / fault).exists() and "exited while idle" not in text:
            problems.append(f"the {service}'s tool host was killed idle but not replaced as such (tool_host.ended)")
    checkpoint = latest_checkpoint(workdir / "runs" / run_id / "learner")
    dropped = checkpoint.sampler.get("dropped_seeds", []) if checkpoint else []
    if dropped:
        problems.append(f"seed tasks dropped from the learner's pool: {dropped}")
    refused = [e["task_id"] for e in log["TaskChecked"] if "loading the initial state" in e.get("reason", "")]
    if refused:
        problems.append(f"proposals rejected because their initial state could not load: {refused}")
    if (workdir / "faults" / "broker").exists() and f"restored log {run_id}:" not in output:
        problems.append("the broker died and the run did not restore its log")
    return problems


def _failed_steps(workdir: Path, summary: dict, log: dict, run_id: str) -> list[str]:
    """The learner stopped with a message at the push to the killed server and the run resumed past it on
    the fleet; the publish the broker outage broke was sent again until the broker came back."""
    problems = [] if summary["rollout"] == "vllm-server" else [f"the learner rolled out on {summary['rollout']}"]
    lines = (workdir / "logs" / "learner.log").read_text(errors="replace").splitlines()
    named = ('"learner.step_failed"', '"learner.publish_retry"')
    events = [json.loads(line) for line in lines if any(name in line for name in named)]
    failed = sorted((e["step"], e["reason"].split(":")[0]) for e in events if e["event"] == "learner.step_failed")
    if failed != [(1, "WeightTransferError")]:
        problems.append(f"the learner's failed steps (step, error): {failed}; expected step 1's push to the killed "
                        f"server only (step {OUTAGE_STEP}'s publish rides out the outage)")
    seconds = (workdir / "faults" / "outage").read_text() if (workdir / "faults" / "outage").exists() else ""
    if seconds and float(seconds) < DELIVERY_TIMEOUT_S - 1:
        problems.append(f"the first publish gave up {seconds} s into the outage, before the producer's delivery "
                        f"timeout of {DELIVERY_TIMEOUT_S:g} s")
    if seconds and not any(e["event"] == "learner.publish_retry" and e["step"] == OUTAGE_STEP for e in events):
        problems.append(f"step {OUTAGE_STEP}'s publish was not sent again through the outage (learner.publish_retry)")
    pushed = [e for e in log["PolicyUpdated"] if e["run_id"] == run_id]
    if not pushed or any(e["servers"] < 1 for e in pushed):
        problems.append(f"policy updates taken by no server, or none published: {pushed}")
    return problems


def _backlog(record: Path, log: dict, run_id: str) -> list[str]:
    """The explorer started on several closed periods at once and explored each."""
    waited = int(record.read_text() or 0) if record.exists() else 0
    if record.exists() and waited < BACKLOG:
        return [f"the explorer started with {waited} steps on the broker, not the {BACKLOG} it waited for"]
    explored = {e["step"] for e in log["ExplorationRecorded"] if e["run_id"] == run_id}
    missing = sorted(set(range(1, waited + 1)) - explored)
    return [f"steps of the explorer's starting backlog never explored: {missing}"] if missing else []


def _stalled(record: Path) -> list[str]:
    """The validator's dual pass with the stalled call ended within the tool host's bound."""
    seconds = record.read_text() if record.exists() else ""
    if not seconds:
        return ["the validator's dual pass with the stalled call did not end"] if record.exists() else []
    if not STALL_S[0] <= float(seconds) <= STALL_S[1]:
        return [f"the dual pass with the stalled call took {seconds} s, not {STALL_S[0]:g}-{STALL_S[1]:g} s"]
    return []


def read_log(bootstrap: str) -> dict[str, list[dict]]:
    """Every event on the run's topics, by event name, every copy; events on a topic not theirs (the bad
    input) are left out."""
    consumer = EventConsumer(bootstrap, list(CATALOG), service="faults")
    try:
        out: dict[str, list[dict]] = defaultdict(list)
        for item in consumer.drain(idle_s=2.0):
            if CATALOG[item.topic].event == item.name:
                out[item.name].append(item.event)
    finally:
        consumer.close()
    return out


def by_id(events: list[dict]) -> dict[str, dict]:
    return {e["event_id"]: e for e in events}


def check(workdir: Path, bootstrap: str, run_id: str, fired: list[str], unloadable: str, output: str) -> list[str]:
    """Every way the faults could have lost or doubled something, as messages; empty when none did."""
    summary = json.loads((workdir / "summary.json").read_text())
    log = read_log(bootstrap)
    problems = [f"the {name} fault never fired" for name in FAULTS + OTHERS if name not in fired]
    problems += _restarts(summary, fired)
    problems += _stalled(workdir / "faults" / "stall")
    problems += _failed_steps(workdir, summary, log, run_id)
    problems += _backlog(workdir / "faults" / "backlog", log, run_id)
    problems += _dead_letters(log, unloadable)
    problems += _steps_and_trajectories(workdir, summary, log, run_id)
    problems += _updates_once(workdir, log, run_id)
    problems += _verdicts(workdir, summary, log, run_id, unloadable)
    problems += _signals(workdir, summary, log, run_id)
    problems += _hosts(workdir, log, output, run_id)
    return problems


def _dead_letters(log: dict, unloadable: str) -> list[str]:
    """Each consumer dead-lettered the garbage on its topics and the events it does not handle; the
    learner the unloadable task."""
    letters = {(d["service"], d["source_topic"], d["error_type"]) for d in log["DeadLettered"]}
    expected = {("archiver", topic, "malformed") for topic in CATALOG} | {
        ("streams", TRAJECTORIES.name, "malformed"), ("streams", STEPS.name, "malformed"),
        ("explorer", SIGNALS.name, "malformed"), ("explorer", STEPS.name, "malformed"),
        ("validator", EXPLORATIONS.name, "malformed"), ("validator", EXPLORATIONS.name, "invalid"),
        ("learner", TASKS.name, "malformed"), ("learner", TASKS.name, "task_unloadable")}
    problems = [f"no dead letter from {s} for {t} ({e})" for s, t, e in sorted(expected - letters)]
    refused = {d["key"] for d in log["DeadLettered"] if d["error_type"] == "task_unloadable"}
    if refused != {unloadable.encode()}:
        problems.append(f"the learner refused {sorted(refused)}, expected only {unloadable}")
    return problems


def _copies_differ(events: list[dict]) -> list[str]:
    """Event ids sent more than once with different contents."""
    first: dict[str, dict] = {}
    out = []
    for event in events:
        seen = first.setdefault(event["event_id"], event)
        if seen != event:
            out.append(event["event_id"])
    return out


def _steps_and_trajectories(workdir: Path, summary: dict, log: dict, run_id: str) -> list[str]:
    problems = []
    steps = [e for e in log["StepCompleted"] if e["run_id"] == run_id]
    trajectories = [e for e in log["TrajectoryRecorded"] if e["run_id"] == run_id]
    for name, events in (("StepCompleted", steps), ("TrajectoryRecorded", trajectories)):
        if differ := _copies_differ(events):
            problems.append(f"{len(differ)} {name} ids sent with different contents, e.g. {differ[0]}")
    unique = by_id(trajectories)
    per_step = {s["step"]: s["trajectory_count"] for s in by_id(steps).values()}
    if summary["state"] != "completed" or sorted(per_step) != list(range(1, summary["steps"] + 1)):
        problems.append(f"state {summary['state']}, steps on the broker {sorted(per_step)}")
    if len(unique) != sum(per_step.values()) or summary["trajectories"] != len(unique):
        problems.append(f"{len(unique)} trajectories on the broker, the steps count {sum(per_step.values())}, "
                        f"summary.json {summary['trajectories']}")
    slots = {(t["step"], t["task_id"], t["rollout_index"]) for t in unique.values()}
    if len(slots) != len(unique):
        problems.append(f"{len(unique) - len(slots)} rollouts published under two ids")
    rows = _archived(workdir, "SELECT event_id FROM coevolve.trajectories FINAL WHERE run_id = {r:String}", run_id)
    if sorted(r[0] for r in rows) != sorted(unique):
        problems.append(f"the archive holds {len(rows)} trajectories, the broker {len(unique)}")
    return problems


def _updates_once(workdir: Path, log: dict, run_id: str) -> list[str]:
    """Each update was applied once, the learner's kill and resume included: the final checkpoint's AdamW
    has stepped once per policy version the run published, and its update count says the same."""
    import torch

    checkpoint = latest_checkpoint(workdir / "runs" / run_id / "learner")
    if checkpoint is None:
        return ["the learner left no checkpoint"]
    versions = {e["version"] for e in log["PolicyUpdated"] if e["run_id"] == run_id}
    optimizer = torch.load(checkpoint.path / "optimizer.pt", weights_only=True)
    stepped = {int(s["step"]) for s in optimizer["state"].values()}
    counted = json.loads((checkpoint.path / "state.json").read_text())["engine_steps"]
    if stepped != ({len(versions)} if versions else set()) or counted != len(versions):
        return [f"{len(versions)} policy versions published, the optimizer stepped {sorted(stepped)} times, "
                f"the checkpoint counts {counted} updates"]
    return []


def _archived(workdir: Path, sql: str, run_id: str) -> list[tuple]:
    client = connect(chdb_url(workdir), create=False)
    try:
        return client.query(sql, parameters={"r": run_id}).result_rows
    finally:
        client.close()


def _verdicts(workdir: Path, summary: dict, log: dict, run_id: str, unloadable: str) -> list[str]:
    """One verdict per task id on coevolve.tasks and in the archive; no validated task but the unloadable
    one left out of the pool of a step that began after it was published."""
    problems = []
    checked = [e for e in log["TaskChecked"] if e["source"] == "synthesized"]
    verdicts, ids = defaultdict(set), defaultdict(set)
    for e in checked:
        verdicts[e["task_id"]].add(e["verdict"])
        ids[e["task_id"]].add(e["event_id"])
    twice = sorted(t for t in verdicts if len(verdicts[t]) > 1 or len(ids[t]) > 1)
    problems += [f"task {t} has verdicts {sorted(verdicts[t])} under {len(ids[t])} ids" for t in twice]
    rows = dict(_archived(workdir, "SELECT task_id, count() FROM coevolve.tasks FINAL WHERE source = 'synthesized' "
                                   "GROUP BY task_id", run_id))
    if rows != {t: 1 for t in verdicts}:
        problems.append(f"archived verdicts per task {rows}, on the broker {sorted(verdicts)}")
    final = {e["task_id"]: e for e in checked}
    validated = {t for t, e in final.items() if e["verdict"] == "validated"}
    if summary["tasks_proposed"] != len(final) or summary["tasks_validated"] != len(validated):
        problems.append(f"summary.json: {summary['tasks_proposed']} proposed, {summary['tasks_validated']} "
                        f"validated; the broker: {len(final)}, {len(validated)}")
    last = max((e for e in log["StepCompleted"] if e["run_id"] == run_id), key=lambda e: e["step"])
    began = last["produced_at"] - timedelta(seconds=last["duration_seconds"])  # decoded as datetimes
    checkpoint = latest_checkpoint(workdir / "runs" / run_id / "learner")
    pool = {s["task"]["task_id"] for s in checkpoint.sampler["synthesized"]} if checkpoint else set()
    lost = sorted(t for t in validated - {unloadable} if final[t]["produced_at"] < began - MARGIN and t not in pool)
    if lost:
        problems.append(f"validated tasks missing from the learner's last pool: {lost}")
    return problems


def _signals(workdir: Path, summary: dict, log: dict, run_id: str) -> list[str]:
    """The live signals equal `coevolve replay` of the archived trajectories, and summary.json's counts."""
    live = by_id(e for e in log["SignalRaised"] if e["run_id"] == run_id)
    counts = {k: sum(s["kind"] == k for s in live.values()) for k in ("forgetting", "boundary", "rare")}
    problems = [] if summary["signals"] == counts else [f"summary.json signals {summary['signals']}, live {counts}"]
    out = workdir / "replayed.jsonl"
    th = summary["thresholds"]
    flags = [f"--{k.replace('_', '-')}={th[k]}" for k in ("success_threshold", "window", "rare_threshold",
                                                          "pattern_length")]
    done = subprocess.run([EXE, "replay", "--clickhouse", chdb_url(workdir), "--output", str(out), *flags],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return problems + [f"coevolve replay exited with {done.returncode}: {done.stderr[-2000:]}"]
    replayed = {s["id"] for line in out.read_text().splitlines() for s in [json.loads(line)]
                if s["run_id"] == run_id}
    if replayed != set(live):
        problems.append(f"live signals {len(live)}, replayed {len(replayed)}: only live "
                        f"{sorted(set(live) - replayed)[:5]}, only replayed {sorted(replayed - set(live))[:5]}")
    return problems
