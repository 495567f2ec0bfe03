"""A workdir holds many runs (a new `coevolve run` starts a new one, `--resume` continues the latest);
the learner's starting policy is prepared before the services start and shared as configured; a
service that exits or stops answering its /healthz is started again (the learner with --resume)
within the restart budget, here with real processes."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevolve.services.run.children import Child, ChildFailed
from coevolve.services.run.loop import Session, make_children, warm_up_policy, choose_run, train
from coevolve.services.run.plan import make_plan
from coevolve.services.run.supervise import RestartPolicy, Supervisor, Watch
from coevolve.services.run.tally import Tally
from coevolve.services.runtime.config import ConfigError

pytestmark = pytest.mark.integration


def test_runs_in_one_workdir_get_new_ids_and_resume_takes_the_latest(tmp_path):
    plan = make_plan("smoke")
    with pytest.raises(ConfigError, match="--resume: .*run.json does not exist"):
        choose_run(tmp_path, plan, resume=True, run_id=None)
    first = choose_run(tmp_path, plan, resume=False, run_id="first")
    second = choose_run(tmp_path, plan, resume=False, run_id=None)
    assert first == "first" and second != first
    assert choose_run(tmp_path, plan, resume=True, run_id=None) == second


def test_an_explicit_run_id_that_exists_must_be_resumed(tmp_path):
    plan = make_plan("smoke")
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    with pytest.raises(ConfigError, match="already exists.*--resume"):
        choose_run(tmp_path, plan, resume=False, run_id="mine")


def _session(tmp_path, *overrides: str) -> Session:
    plan = make_plan("smoke", list(overrides))
    return Session(plan, tmp_path, choose_run(tmp_path, plan, resume=False, run_id="r"), False,
                   bootstrap="127.0.0.1:1")


def test_the_processes_sharing_the_policy_get_the_learners_starting_model(tmp_path):
    s = _session(tmp_path, "learner.warmup_steps=0", "run.shared_policy=validator")
    warm_up_policy(s)  # a real `coevolve learner --policy-only`: no warm-up, so the configured model
    assert s.policy == "tiny-random"
    children = make_children(s)
    assert children["validator"].env["VALIDATOR_MODEL"] == "tiny-random"
    assert "EXPLORER_MODEL" not in children["explorer"].env
    assert children["explorer"].env["EXPLORER_RUN_ID"] == s.run_id  # the static strategy's records carry it


def test_a_policy_that_cannot_be_prepared_fails_the_run_with_its_log(tmp_path):
    s = _session(tmp_path, "learner.model=no-such-model", "learner.warmup_steps=5")
    with pytest.raises(ChildFailed, match=r"preparing the policy failed \(exit code [1-9].*warmup.log"):
        warm_up_policy(s)
    assert "no-such-model" in (tmp_path / "logs" / "warmup.log").read_text()


def test_a_service_that_exits_is_restarted_within_its_budget_then_fails_the_run(tmp_path, capsys):
    s = _session(tmp_path, "run.restart_budget=1", "run.restart_backoff_s=0")
    # A real `coevolve` process that exits at once (an unknown command: click's usage error, code 2).
    crashing = Child("validator", ["no-such-service"], {}, tmp_path / "logs" / "validator.log").start()
    s.children = {"validator": crashing}
    s.supervisor = Supervisor.of(s.children, s.plan.run)
    first = crashing.process
    first.wait()
    s.supervisor.tend(["validator"])  # scheduled, after a backoff of 0 s
    s.supervisor.tend(["validator"])
    assert crashing.process is not first
    assert "validator exited with code 2; restarting it in 0 s (restart 1; 1 of 1" in capsys.readouterr().out
    crashing.process.wait()
    assert crashing.log_path.read_text().count("No such command") == 2  # one log, appended by both
    with pytest.raises(ChildFailed, match=r"validator exited with code 2; its restarts are spent "
                                          r"\(run.restart_budget=1 .*its log is .*validator.log"):
        s.supervisor.tend(["validator"])
    assert [(r["service"], r["cause"], r["exit_code"], r["number"]) for r in s.restarts] == [
        ("validator", "exit", 2, 1)]
    assert "No such command" in s.restarts[0]["last_log"]


class NoEvents:
    def poll(self, timeout_s):
        time.sleep(0.05)
        return []


# Prints its arguments; fails unless started with --resume, as a learner that crashes once.
LEARNER = "import sys; print('args:', *sys.argv[1:], flush=True); sys.exit(0 if '--resume' in sys.argv else 3)"


def test_a_learner_that_fails_is_restarted_with_resume_and_the_run_trains_until_it_finishes(tmp_path):
    s = _session(tmp_path, "run.restart_backoff_s=0")
    s.children = {"learner": make_children(s)["learner"]}
    learner = s.children["learner"]
    assert learner.finishes and learner.rerun_args == ["--resume"] and "--resume" not in learner.args
    learner.program = [sys.executable, "-c", LEARNER]
    s.supervisor, s.consumer = Supervisor.of(s.children, s.plan.run), NoEvents()
    learner.start()
    train(s, Tally(run_id="r"), set())  # returns once the learner exits with code 0
    assert learner.exit_code == 0
    runs = [line for line in learner.log_path.read_text().splitlines() if line.startswith("args:")]
    assert len(runs) == 2 and "--resume" not in runs[0] and runs[1].endswith(f"--resume --metrics-port {learner.port}")
    assert [(r["service"], r["exit_code"], r["number"]) for r in s.restarts] == [("learner", 3, 1)]


def test_a_resumed_runs_learner_gets_resume_once_when_restarted(tmp_path):
    s = Session(make_plan("smoke"), tmp_path, "r", True, bootstrap="127.0.0.1:1")
    learner = make_children(s)["learner"]
    learner.program = [sys.executable, "-c", "pass"]
    learner.restart().process.wait()
    assert learner.args.count("--resume") == 1 and learner.command.count("--resume") == 1


# Serves /healthz on the port of its last argument: 200 and ready for HEALTHY_S seconds, then 503.
HEALTHZ = """
import http.server, json, sys, time
born = time.monotonic()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"ready": True}).encode()
        self.send_response(200 if time.monotonic() - born < HEALTHY_S else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[-1])), Health).serve_forever()
"""


def _python(tmp_path, name: str, script: str) -> Child:
    return Child(name, [], {}, tmp_path / "logs" / f"{name}.log", program=[sys.executable, "-c", script])


def _tend_until(sup: Supervisor, names, done, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        sup.tend(names)
        time.sleep(0.05)


@pytest.fixture
def children():
    made: list[Child] = []
    yield made
    for child in made:
        child.kill()


def test_a_process_whose_healthz_turns_unhealthy_is_killed_and_restarted(tmp_path, children, capsys):
    child = _python(tmp_path, "archiver", HEALTHZ.replace("HEALTHY_S", "1.0")).start()
    children.append(child)
    sup = Supervisor({"archiver": child}, RestartPolicy(budget=2, backoff_s=0.0), {"archiver": 1.0},
                     start_timeout_s=20.0, probe_every_s=0.2, probe_timeout_s=1.0)
    first = child.process
    _tend_until(sup, ["archiver"], lambda: child.process is not first)
    assert first.returncode == -9 and child.process is not first
    assert [(r.cause, r.exit_code, r.number, r.last_log) for r in sup.restarts] == [("liveness", -9, 1, "serving")]
    assert "archiver was killed (its /healthz failed for" in capsys.readouterr().out


def test_a_process_that_never_answers_is_killed_after_the_start_timeout(tmp_path, children, capsys):
    child = _python(tmp_path, "explorer", "import time; time.sleep(60)").start()
    children.append(child)
    sup = Supervisor({"explorer": child}, RestartPolicy(budget=0), {"explorer": 60.0}, start_timeout_s=1.0,
                     probe_every_s=0.2, probe_timeout_s=1.0)
    with pytest.raises(ChildFailed, match=r"explorer exited with code -9 \(killed: it did not answer /healthz "
                                          r"ready within run.start_timeout_s=1 s\); its restarts are spent"):
        _tend_until(sup, ["explorer"], lambda: False, timeout_s=10.0)
    assert child.exit_code == -9


def test_a_healthy_process_is_left_running(tmp_path, children):
    child = _python(tmp_path, "streams", HEALTHZ.replace("HEALTHY_S", "1e9")).start()
    children.append(child)
    sup = Supervisor({"streams": child}, RestartPolicy(budget=0), {"streams": 0.5}, start_timeout_s=20.0,
                     probe_every_s=0.2, probe_timeout_s=1.0)
    _tend_until(sup, ["streams"], lambda: sup.watches.get("streams", Watch(0.0)).up)
    _tend_until(sup, ["streams"], lambda: False, timeout_s=2.0)
    assert child.exit_code is None and sup.restarts == [] and sup.watches["streams"].up


def test_start_up_waits_for_nothing_from_a_learner_that_finished_and_fails_on_any_other_exit(tmp_path):
    from coevolve.services.run.children import wait_healthy

    done = Child("learner", [], {}, tmp_path / "learner.log", program=["true"], finishes=True).start()
    while done.exit_code is None:
        time.sleep(0.05)
    wait_healthy([done], timeout_s=5.0)  # steps = 0: it evaluated and exited before the first probe
    quit_early = Child("explorer", [], {}, tmp_path / "explorer.log", program=["true"]).start()
    with pytest.raises(ChildFailed, match="explorer exited with code 0"):
        wait_healthy([quit_early], timeout_s=5.0)


# A service that starts a helper in a session of its own (as the learner starts torchrun, and torchrun its
# ranks) and ignores SIGTERM; the helper ignores it too.
TREE = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
helper = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                          "signal.SIG_IGN); time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(helper.pid))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_stopped_or_killed_child_leaves_nothing_it_started_even_in_another_session(tmp_path, how):
    marker = tmp_path / "helper.pid"
    child = Child("learner", [str(marker)], {}, tmp_path / "learner.log", program=[sys.executable, "-c", TREE])
    child.start()
    deadline = time.monotonic() + 30
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline and child.exit_code is None, child.log_tail()
        time.sleep(0.05)
    helper = int(marker.read_text())
    assert _alive(helper)
    if how == "stop":
        child.stop(timeout_s=1.0)  # SIGTERM is ignored: killed after the wait, with the helper
    else:
        child.kill()
    assert child.exit_code is not None and not _alive(helper)


LEAVES = """
import subprocess, sys
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # in the child's session
open(sys.argv[1], "w").write(str(helper.pid))
sys.exit(3)
"""


@pytest.mark.parametrize("how", ["stop", "kill", "restart"])
def test_a_child_that_exited_on_its_own_leaves_nothing_in_its_session(tmp_path, how):
    """A crashed learner's ranks and model servers outlive it in its session: stopping, killing or restarting
    the exited child reaps them instead of leaving them to PR_SET_PDEATHSIG."""
    marker = tmp_path / "helper.pid"
    child = Child("learner", [str(marker)], {}, tmp_path / "learner.log", program=[sys.executable, "-c", LEAVES])
    child.start()
    deadline = time.monotonic() + 30
    while child.exit_code is None:
        assert time.monotonic() < deadline, child.log_tail()
        time.sleep(0.05)
    helper = int(marker.read_text())
    assert child.exit_code == 3 and _alive(helper)
    if how == "stop":
        assert child.stop() == 3
    elif how == "kill":
        child.kill()
    else:
        marker.unlink()
        child.restart()
    assert not _alive(helper)
    if how == "restart":
        child.stop(timeout_s=5.0)


def test_a_session_whose_leader_pid_is_alive_again_is_not_reaped_as_a_gone_childs():
    """A pid is free for reuse once its session has no member left; a new process that took it and made a
    session of its own is someone else's, and its members are not a gone child's leftovers."""
    from coevolve.services.runtime.processes import session

    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not session(leader.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session(leader.pid)) == 1  # its child, in its session
        assert session(leader.pid, leader_gone=True) == {}  # the pid is held by a live leader: not ours
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
