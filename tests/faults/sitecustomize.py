"""Fault injection for the fault-injection run (`tests/faults/scenario.py`).

With this folder on PYTHONPATH and COEVOLVE_FAULTS naming a folder, Python imports this module at the
start of every process of the run (`site` imports `sitecustomize`), and it SIGKILLs each service once,
at the moment where a crash costs the most:

- validator: after its verdicts are confirmed on coevolve.tasks, before it commits the explorations;
- explorer:  after its explorations are confirmed, before it commits the signals;
- streams:   after a batch's sends and changelog writes are confirmed, before Faust acknowledges it;
- learner:   after step 2 is published, before its checkpoint.

And four more faults, each once:
- stall:   the first attempt the validator's dual pass scores starts with a call that would compute for
           minutes in-process (`STALL`, a MathAPI call, so the task gets MathAPI's stateless tools for
           that pass); the tool host stops it at its limit. The file holds the dual pass's seconds.
- fleet:   the learner's rollout server is SIGKILLed (with its engine and worker) during the push of
           the first update, after the server has paused and entered the transfer round. The file holds
           the killed server's pid.
- outage:  the broker becomes unreachable from the learner while it publishes step `OUTAGE_STEP`, for
           longer than its producer's delivery timeout: its connections are cut and each new one is
           refused. The file holds the seconds until the first publish failed; the learner publishes
           the step again once the broker is back.
- backlog: the explorer's first poll waits until `BACKLOG` of the run's steps are on coevolve.steps, so
           it starts on several closed periods at once. The file holds how many there were.
- broker:  the run's embedded broker is SIGKILLed `BROKER_AFTER_S` after the run printed its first step
           (mid-step, past the archiver's batch); the run restores its log and restarts every service.
           The file holds the broker's pid.
- host-learner, host-validator: the tool host of the learner and of the validator is SIGKILLed while
           idle (no request in flight), before that process's second workspace opens. The file holds
           the host's pid.
- catalog: the validator's start after its SIGKILL finds coevolve.tasks with no partition listed (as
           while a broker restarts), so its complete catalog read fails and it exits; the run starts it
           again.

The run process also puts the scenario's input on its broker before any service starts
(`scenario.inject`): a validated task, and garbage and misplaced events on every topic.

Each fires once per run: the first process to reach its moment creates `<COEVOLVE_FAULTS>/<fault>`
(exclusively); a killed process writes its pid there, then kills itself; a restarted process finds the
file and runs on. The patches are applied as each module is first imported, so nothing changes in the
services' code.
"""
import dataclasses
import errno
import gc
import importlib.abc
import os
import signal
import socket
import sys
import time

FOLDER = os.environ.get("COEVOLVE_FAULTS")
STEP = 2  # the learner dies after publishing this step
STALL = "round_number(number=1, decimal_places=-100000000)"  # CPython builds 10**(10**8): minutes
OUTAGE_STEP = 3  # the learner loses the broker while publishing this step (the smoke preset's last)
BACKLOG = 2  # steps on the broker before the explorer's first poll
BROKER_AFTER_S = 5.0  # the broker dies this long after the run printed its first step
# Which process this is: `coevolve run`, or the service a child of the run runs.
SERVICE = next((a for a in sys.argv[1:] if a in ("run", "learner", "validator", "explorer", "streams", "archiver")), "")
PUSH = {}  # the fleet server being pushed to and the version, in the learner


def claim(fault: str) -> bool:
    """Whether this process is the first to reach `fault` in this run (it creates the fault's file)."""
    try:
        os.close(os.open(os.path.join(FOLDER, fault), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def note(fault: str, text: str) -> None:
    with open(os.path.join(FOLDER, fault), "w") as fh:
        fh.write(text)


def _noted(fault: str) -> bool:
    with open(os.path.join(FOLDER, fault)) as fh:
        return bool(fh.read())


def fire(service: str) -> None:
    """SIGKILL this process unless `service`'s fault fired already in this run."""
    if not claim(service):
        return
    note(service, str(os.getpid()))
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_before_commit(cls, service: str, published) -> None:
    """Wrap `cls._publish` to note whether it sent anything, and `cls._commit` to die before committing it."""
    publish, commit = cls._publish, cls._commit

    def _publish(self, *args):
        publish(self, *args)
        self._fault_due = published(*args)

    def _commit(self):
        if getattr(self, "_fault_due", False):
            fire(service)
        return commit(self)

    cls._publish, cls._commit = _publish, _commit


def validator(module) -> None:
    _kill_before_commit(module.Validator, "validator", lambda groups, results: any(r.record for r in results))


def explorer(module) -> None:
    _kill_before_commit(module.Explorer, "explorer", lambda outcomes: any(o.records for o in outcomes))
    poll = module.Explorer.poll

    def first_poll(self):
        if claim("backlog") or not _noted("backlog"):  # again when the explorer died while it waited
            note("backlog", str(_await_steps(self, BACKLOG)))
        module.Explorer.poll = poll
        poll(self)

    module.Explorer.poll = first_poll


def _await_steps(service, count: int, limit_s: float = 600.0) -> int:
    """Wait (beating) until `count` of the run's StepCompleted are on coevolve.steps; return how many are."""
    from coevolve.services.kafka.consumer import EventConsumer
    from coevolve.services.kafka.topics import STEPS

    consumer = EventConsumer(service.cfg.kafka_bootstrap, [STEPS.name], service="faults")
    steps: set[int] = set()
    deadline = time.monotonic() + limit_s
    try:
        while len(steps) < count and time.monotonic() < deadline and not service.stopping:
            steps |= {item.event["step"] for item in consumer.poll(1.0) if item.name == "StepCompleted"
                      and item.event["run_id"] == service.cfg.run_id}
            service.beat()
    finally:
        consumer.close()
    return len(steps)


def streams(module) -> None:
    store = module.store_batch

    async def store_batch(app, agent, sends, *writes):
        await store(app, agent, sends, *writes)
        if sends:
            fire("streams")

    module.store_batch = store_batch


def stages(module) -> None:
    dual_pass = module.check_dual_pass

    def check_dual_pass(task, attempts):
        if not attempts or not claim("stall"):
            return dual_pass(task, attempts)
        first = [list(turn) for turn in attempts[0]] or [[]]
        math = dataclasses.replace(task, involved_classes=tuple(dict.fromkeys(task.involved_classes + ("MathAPI",))))
        started = time.monotonic()
        outcome = dual_pass(math, [[[STALL] + first[0]] + first[1:]] + list(attempts[1:]))
        with open(os.path.join(FOLDER, "stall"), "w") as fh:
            fh.write(f"{time.monotonic() - started:.1f}")
        return outcome

    module.check_dual_pass = check_dual_pass


def publish(module) -> None:
    publish_step = module.publish_step

    def patched(producer, run_id, path, trajectories, evaluations, record, *args, **kwargs):
        if record.step != OUTAGE_STEP or not claim("outage"):
            return publish_step(producer, run_id, path, trajectories, evaluations, record, *args, **kwargs)
        started = time.monotonic()
        _partition(producer.bootstrap, producer.delivery_timeout_s + 15.0)
        try:
            return publish_step(producer, run_id, path, trajectories, evaluations, record, *args, **kwargs)
        finally:
            note("outage", f"{time.monotonic() - started:.1f}")

    module.publish_step = patched


def _partition(bootstrap: str, seconds: float) -> None:
    """Cut this process's connections to the broker and refuse new ones for `seconds`."""
    host, port = bootstrap.rsplit(":", 1)
    broker, until = (socket.gethostbyname(host), int(port)), time.monotonic() + seconds
    connect_ex = socket.socket.connect_ex

    def refused(sock, address):
        if time.monotonic() < until and tuple(address[:2]) == broker:
            return errno.ECONNREFUSED
        return connect_ex(sock, address)

    socket.socket.connect_ex = refused
    for sock in [o for o in gc.get_objects() if isinstance(o, socket.socket)]:
        try:
            if sock.fileno() >= 0 and sock.getpeername()[:2] == broker:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected


def servers(module) -> None:
    start = module.LocalServers.start

    def started(self):
        PUSH["servers"] = self
        return start(self)

    module.LocalServers.start = started


def backend(module) -> None:
    push = module.FleetBackend._push

    def pushing(self, server, source, version):
        PUSH.update(index=server.index, version=version)
        try:
            return push(self, server, source, version)
        finally:
            PUSH.pop("version", None)

    module.FleetBackend._push = pushing


def transfer(module) -> None:
    broadcast = module._broadcast

    def first_broadcast(group, tensor):
        if PUSH.get("version", 0) >= 1 and "servers" in PUSH and claim("fleet"):
            process = PUSH["servers"].processes[PUSH["index"]]
            note("fleet", str(process.pid))
            PUSH["servers"].kill(PUSH["index"])
        return broadcast(group, tensor)

    module._broadcast = first_broadcast


def learner(module) -> None:
    checkpoint = module.Learner._checkpoint

    def _checkpoint(self):
        if self.done >= STEP:
            fire("learner")
        checkpoint(self)

    module.Learner._checkpoint = _checkpoint


def run_loop(module) -> None:
    from tests.faults.scenario import inject

    start, follow = module.start, module.follow
    due: list[float] = []

    def starting(s):
        inject(s.bootstrap, s.run_id)
        start(s)

    def following(s, tally, printed):
        follow(s, tally, printed)
        if printed and s.broker is not None:
            due[:] = due or [time.monotonic() + BROKER_AFTER_S]
            if time.monotonic() >= due[0] and claim("broker"):
                note("broker", str(s.broker.process.pid))
                s.broker.process.kill()

    module.start, module.follow = starting, following


def tool_host(module) -> None:
    if SERVICE not in ("learner", "validator") or "--policy-only" in sys.argv:
        return
    open_workspace = module.ToolHost.open

    def opening(self, task):
        if self._process is not None and self._process.poll() is None and claim(f"host-{SERVICE}"):
            with self._lock:  # no request in flight: the host dies idle
                note(f"host-{SERVICE}", str(self._process.pid))
                self._process.kill()
                self._process.wait()
        return open_workspace(self, task)

    module.ToolHost.open = opening


def consumer(module) -> None:
    if SERVICE != "validator":
        return
    partitions = module.EventConsumer._partitions

    def listed(self, topics, timeout_s):
        restarted = os.path.exists(os.path.join(FOLDER, "validator"))  # after its own SIGKILL
        if self.service == "validator-catalog" and restarted and claim("catalog"):
            return []
        return partitions(self, topics, timeout_s)

    module.EventConsumer._partitions = listed


PATCHES = {"coevolve.services.validator.service": validator, "coevolve.services.validator.stages": stages,
           "coevolve.services.explorer.service": explorer,
           "coevolve.streams.worker.faust_compat": streams, "coevolve.services.learner.loop.service": learner,
           "coevolve.services.learner.loop.publish": publish, "coevolve.services.fleet.servers": servers,
           "coevolve.services.fleet.backend": backend, "coevolve.services.fleet.transfer": transfer,
           "coevolve.services.envs.host": tool_host, "coevolve.services.kafka.consumer": consumer}
if SERVICE == "run":  # the run process builds the scenario's input with the services' own code, unpatched
    PATCHES = {"coevolve.services.run.loop": run_loop}


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Find the patched modules with the other finders, and patch each right after it has run."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


if FOLDER:
    sys.meta_path.insert(0, PatchOnImport())
