"""`coevolve run`: start the embedded stack, run the learner to its last step, drain the loop, stop.

Order: broker and topics; the learner's policy (its warm-up, in a process of its own); the signal
worker, archiver, validator and explorer; the learner. The
terminal shows a line per training step, read back from the broker (`Tally`); every service writes its
JSON log to `<workdir>/logs/`. After the last step the run waits until the worker, explorer and
validator have consumed everything (their committed offsets reach the end of their topics), stops
them, lets the archiver catch up, writes `summary.json` and the report. Throughout, a service that
exits, or whose `/healthz` stops answering healthy, is restarted within the restart policy
(`supervise.py`; the learner with `--resume`). Ctrl-C stops the learner at its step boundary (it
checkpoints) and then everything else; `--resume` picks the run up.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.topics import (CATALOG, EXPLORATIONS, SIGNALS, STEPS, TRAJECTORIES,
                                            create_topics)
from coevolve.services.run import durable
from coevolve.services.run.children import Child, ChildFailed, coevolve_command, wait_healthy
from coevolve.services.run.lag import LagProbe
from coevolve.services.run.plan import Plan
from coevolve.services.run.supervise import Supervisor
from coevolve.services.run.tally import Tally
from coevolve.services.runtime.config import ConfigError
from coevolve.services.runtime.log import get_logger

log = get_logger("run")
# The topics whose ends each service's consumer group must reach before the run counts as drained.
DRAIN_TOPICS = {"streams": (TRAJECTORIES.name, STEPS.name), "explorer": (SIGNALS.name, STEPS.name),
                "validator": (EXPLORATIONS.name,)}


@dataclass
class Session:
    """One `coevolve run` invocation: its workdir, run id, processes and what it has seen."""

    plan: Plan
    workdir: Path
    run_id: str
    resume: bool
    bootstrap: str = ""
    broker: EmbeddedBroker | None = None  # the embedded one, whose log the archive keeps; None with --bootstrap
    children: dict[str, Child] | None = None
    consumer: EventConsumer | None = None
    policy: str = ""
    supervisor: Supervisor | None = None

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def restarts(self) -> list[dict]:
        """Every restart of a service in this session, for summary.json."""
        return self.supervisor.report() if self.supervisor else []


def choose_run(workdir: Path, plan: Plan, resume: bool, run_id: str | None) -> str:
    """The run id: a new one (recorded in `<workdir>/run.json` as the latest), or with --resume the
    latest. Runs share the workdir's archive, so the report compares them; each has its own state."""
    record = workdir / "run.json"
    if resume:
        if not record.is_file():
            raise ConfigError(f"--resume: {record} does not exist; start a run in {workdir} first")
        return json.loads(record.read_text())["run_id"]
    run_id = run_id or f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    if (workdir / "runs" / run_id).exists():
        raise ConfigError(f"run {run_id} already exists in {workdir}; continue it with --resume, or pick "
                          "another --run-id")
    workdir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"run_id": run_id, "preset": plan.preset}) + "\n")
    return run_id


def _learner_args(s: Session) -> list[str]:
    """The learner's arguments; a restarted learner also gets --resume (`make_children`)."""
    return ["learner", "--bootstrap", s.bootstrap, "--workdir", str(s.workdir / "runs" / s.run_id / "learner"),
            "--run-id", s.run_id] + (["--resume"] if s.resume else [])


def make_children(s: Session) -> dict[str, Child]:
    """The service processes, each with its preset section as environment variables (and the learner's
    policy as the model of those in run.shared_policy)."""
    b, w, state = ["--bootstrap", s.bootstrap], s.workdir, s.workdir / "runs" / s.run_id
    commands = {"streams": ["streams", "worker", *b, "--datadir", str(state / "streams")],
                "archiver": ["archiver", *b, "--workdir", str(w)],
                "validator": ["validator", *b], "explorer": ["explorer", *b], "learner": _learner_args(s)}
    shared = set(s.plan.run.sharing) if s.policy else set()
    extra = {name: {"model": s.policy} if name in shared else {} for name in commands}
    extra["explorer"]["run_id"] = s.run_id  # the static strategy records its start exploration under it
    if s.broker is not None:
        extra["archiver"]["log_id"] = s.run_id  # the embedded broker's log, kept to be restored (durable.py)
    children = {name: Child(name, args, s.plan.env(name, **extra[name]), s.logs / f"{name}.log")
                for name, args in commands.items()}
    # Exit code 0 is the learner's last step; started again, it continues from its last checkpoint.
    children["learner"].finishes, children["learner"].rerun_args = True, ["--resume"]
    return children


def warm_up_policy(s: Session) -> None:
    """Warm the learner's policy up before any service starts (it then has the cores to itself, and the
    learner finds it cached), and note it for run.shared_policy. Nothing to do without either."""
    warm = bool(s.plan.value("learner", "warmup_steps", 0))
    if not (warm or s.plan.run.sharing):
        return
    log_path = s.logs / "warmup.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"preparing the policy{' (supervised warm-up, once per setting)' if warm else ''}: log {log_path}",
          flush=True)
    clock = time.monotonic()
    with open(log_path, "ab") as err:
        done = subprocess.run([coevolve_command(), "--log-level", "info", *_learner_args(s), "--policy-only"],
                              stdout=subprocess.PIPE, stderr=err, env={**os.environ, **s.plan.env("learner")},
                              start_new_session=True)
    lines = [line.strip() for line in done.stdout.decode(errors="replace").splitlines() if line.strip()]
    if done.returncode or not lines:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise ChildFailed(f"preparing the policy failed (exit code {done.returncode}); its log is {log_path}:\n{tail}")
    s.policy = lines[-1]
    shared = f"; the {' and '.join(s.plan.run.sharing)} act with it" if s.plan.run.sharing else ""
    print(f"policy {s.policy} ready in {time.monotonic() - clock:.0f} s{shared}", flush=True)


def follow(s: Session, tally: Tally, printed: set[int]) -> None:
    """Read what arrived on the broker and print a line per newly completed step."""
    for item in s.consumer.poll(0.5):
        tally.add(item.name, item.event)
    for step in sorted(set(tally.steps) - printed):
        print(tally.progress_line(step, s.plan.run.steps), flush=True)
        trained = tally.synthesized_line(step)
        if trained:
            print(trained, flush=True)
        printed.add(step)


def train(s: Session, tally: Tally, printed: set[int]) -> None:
    """Follow the run until the learner finishes (exits with code 0); the supervisor restarts any service
    that exits or fails its liveness, the learner with --resume, and ends the run past a budget."""
    learner = s.children["learner"]
    while learner.exit_code != 0:
        follow(s, tally, printed)
        durable.tend_broker(s)
        s.supervisor.tend(s.children)


def drain(s: Session, tally: Tally, printed: set[int]) -> bool:
    """Wait until the worker, explorer and validator have consumed everything, restarting any service that
    exits or fails its liveness; False on timeout."""
    probe = LagProbe(s.bootstrap)
    deadline = time.monotonic() + s.plan.run.drain_timeout_s
    quiet_since, seen = time.monotonic(), len(tally.seen)
    groups = {name: (s.plan.consumer_group(name), topics) for name, topics in DRAIN_TOPICS.items()}
    try:
        while time.monotonic() < deadline:
            follow(s, tally, printed)
            durable.tend_broker(s)
            s.supervisor.tend(s.children)
            behind = probe.behind(groups)
            if len(tally.seen) != seen or any(behind.values()):
                quiet_since, seen = time.monotonic(), len(tally.seen)
                log.info("run.draining", behind=behind)
            elif time.monotonic() - quiet_since >= s.plan.run.quiet_s:
                return True
            time.sleep(1.0)
        return False
    finally:
        probe.close()


def settle_archive(s: Session, timeout_s: float = 120.0) -> None:
    """Let the archiver store everything on the broker (restarted if it exits or hangs), then stop it."""
    archiver = s.children["archiver"]
    probe = LagProbe(s.bootstrap)
    deadline = time.monotonic() + timeout_s
    group = s.plan.consumer_group("archiver")
    try:
        while time.monotonic() < deadline:
            if s.supervisor is not None:
                s.supervisor.tend(["archiver"])
            elif archiver.exit_code is not None:  # the services never all came up: nothing restarts it
                break
            if archiver.exit_code is None and probe.lag(group, list(CATALOG)) == 0:
                break
            time.sleep(1.0)
    except ChildFailed as exc:  # the run stops anyway; what the archiver did not store stays on the broker
        print(f"the archiver did not catch up: {exc}", flush=True)
    finally:
        probe.close()
    archiver.stop()


def start(s: Session) -> None:
    durable.resume_log(s)
    create_topics(s.bootstrap)
    s.consumer = EventConsumer(s.bootstrap, list(CATALOG), service="run")
    s.children = make_children(s)
    for name, child in s.children.items():
        child.start()
        print(f"started {name:9s} log {child.log_path}", flush=True)
    wait_healthy(list(s.children.values()), s.plan.run.start_timeout_s)
    s.supervisor = Supervisor.of(s.children, s.plan.run)
    print("every service is up; training", flush=True)


def stop_all(s: Session, order: tuple[str, ...] = ("learner", "explorer", "validator", "streams")) -> None:
    for name in order:
        if s.children and name in s.children:
            s.children[name].stop(timeout_s=180.0 if name == "learner" else 60.0)
