"""Fault injection for the fault-injection run (`tests/faults/scenario.py`).

With this folder on PYTHONPATH and COEVOLVE_FAULTS naming a folder, Python imports this module at the
start of every process of the run (`site` imports `sitecustomize`), and it SIGKILLs each service once,
at the moment where a crash costs the most:

- validator: after its verdicts are confirmed on coevolve.tasks, before it commits the explorations;
- explorer:  after its explorations are confirmed, before it commits the signals;
- streams:   after a batch's sends and changelog writes are confirmed, before Faust acknowledges it;
- learner:   after step 2 is published, before its checkpoint.

And one call stalls: the first attempt the validator's dual pass scores starts with a call that would
compute for minutes in-process (`STALL`, a MathAPI call, so the task gets MathAPI's stateless tools for
that pass); the tool host stops it at its limit, and `<COEVOLVE_FAULTS>/stall` records how many seconds
that dual pass took.

Each fires once per run: the first process to reach its moment creates `<COEVOLVE_FAULTS>/<service>`
(exclusively) with its pid, then kills itself; a restarted process finds the file and runs on. The
patches are applied as each module is first imported, so nothing changes in the services' code.
"""
import dataclasses
import importlib.abc
import os
import signal
import sys
import time

FOLDER = os.environ.get("COEVOLVE_FAULTS")
STEP = 2  # the learner dies after publishing this step
STALL = "round_number(number=1, decimal_places=-100000000)"  # CPython builds 10**(10**8): minutes


def claim(fault: str) -> bool:
    """Whether this process is the first to reach `fault` in this run (it creates the fault's file)."""
    try:
        os.close(os.open(os.path.join(FOLDER, fault), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def fire(service: str) -> None:
    """SIGKILL this process unless `service`'s fault fired already in this run."""
    if not claim(service):
        return
    with open(os.path.join(FOLDER, service), "w") as fh:
        fh.write(str(os.getpid()))
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


def learner(module) -> None:
    checkpoint = module.Learner._checkpoint

    def _checkpoint(self):
        if self.done >= STEP:
            fire("learner")
        checkpoint(self)

    module.Learner._checkpoint = _checkpoint


PATCHES = {"coevolve.services.validator.service": validator, "coevolve.services.validator.stages": stages,
           "coevolve.services.explorer.service": explorer,
           "coevolve.streams.worker.faust_compat": streams, "coevolve.services.learner.loop.service": learner}


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
