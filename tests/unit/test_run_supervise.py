"""The run's supervisor restarts a service that exits after a backoff that doubles within the window, ends
the run past the restart budget, leaves a finished learner alone, and kills a service whose /healthz
fails longer than its allowance (or that never answers ready within the start-up time)."""
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from coevolve.services.run.children import Child, ChildFailed
from coevolve.services.run.plan import make_plan
from coevolve.services.run.supervise import RestartPolicy, Supervisor, Watch, alive, backoff, observe

POLICY = RestartPolicy(budget=3, window_s=100.0, backoff_s=1.0, backoff_max_s=3.0)


def test_the_backoff_doubles_with_each_restart_in_the_window_up_to_its_cap():
    assert backoff(POLICY, [], now=0.0) == 1.0
    assert backoff(POLICY, [0.0], now=1.0) == 2.0
    assert backoff(POLICY, [0.0, 2.0], now=5.0) == 3.0  # 4 s, capped at backoff_max_s


def test_the_budget_counts_only_restarts_within_the_window():
    assert backoff(POLICY, [0.0, 10.0, 20.0], now=30.0) is None
    assert backoff(POLICY, [0.0, 10.0, 20.0], now=100.0) == 3.0  # the first has left the window
    assert backoff(POLICY, [0.0, 10.0, 20.0], now=500.0) == 1.0  # quiet for a window: back to the start
    assert backoff(RestartPolicy(budget=0), [], now=0.0) is None


def test_a_process_has_its_start_up_time_until_it_first_answers_ready():
    watch = Watch(since=0.0)
    watch = observe(watch, None, now=5.0)
    watch = observe(watch, {"ready": False}, now=50.0)  # healthy, still loading its model
    assert not watch.up and alive(watch, now=299.0, start_timeout_s=300.0, allowance_s=10.0)
    assert not alive(watch, now=301.0, start_timeout_s=300.0, allowance_s=10.0)
    watch = observe(watch, {"ready": True}, now=60.0)
    assert watch.up and alive(watch, now=10_000.0, start_timeout_s=300.0, allowance_s=10.0)


def test_once_up_only_failures_in_a_row_longer_than_the_allowance_kill():
    watch = observe(Watch(since=0.0), {"ready": True}, now=1.0)
    watch = observe(watch, None, now=10.0)
    watch = observe(watch, None, now=15.0)  # still failing since 10
    assert watch.failing_since == 10.0
    assert alive(watch, now=20.0, start_timeout_s=1.0, allowance_s=10.0)
    assert not alive(watch, now=20.5, start_timeout_s=1.0, allowance_s=10.0)
    watch = observe(watch, {"status": "ok"}, now=20.0)  # one healthy answer resets the count
    assert watch.failing_since is None and alive(watch, now=1000.0, start_timeout_s=1.0, allowance_s=10.0)


@dataclass
class FakeChild:
    """A process whose exit code and /healthz answer the test sets."""

    name: str
    code: int | None = None
    answer: dict | None = field(default_factory=lambda: {"ready": True})
    finishes: bool = False
    rerun_args: list[str] = field(default_factory=list)
    starts: int = 0
    probes: int = 0
    killed: bool = False
    log_bounds: int = 0
    log_path: Path = Path("/nonexistent/fake.log")

    @property
    def exit_code(self):
        return self.code

    def restart(self):
        self.starts += 1
        self.code, self.killed = None, False

    def health(self, timeout_s):
        self.probes += 1
        return self.answer

    def kill(self):
        self.code, self.killed = -9, True

    def bound_log(self):
        self.log_bounds += 1
        return False

    def last_line(self):
        return f"last words of {self.name}"

    def failure(self, detail=""):
        return ChildFailed(f"{self.name} exited with code {self.code}{detail}")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _supervisor(*children, budget=3, allowance_s=10.0):
    clock = Clock()
    sup = Supervisor({c.name: c for c in children}, RestartPolicy(budget, 100.0, 1.0, 3.0),
                     {c.name: allowance_s for c in children}, start_timeout_s=30.0, probe_every_s=5.0, clock=clock)
    return sup, clock


def test_an_exited_service_restarts_only_after_its_backoff_and_each_restart_is_recorded(capsys):
    child = FakeChild("validator", code=2)
    sup, clock = _supervisor(child)
    sup.tend(["validator"])
    assert child.starts == 0 and "validator exited with code 2; restarting it in 1 s" in capsys.readouterr().out
    clock.now = 0.9
    sup.tend(["validator"])
    assert child.starts == 0
    clock.now = 1.0
    sup.tend(["validator"])
    assert child.starts == 1
    child.code, clock.now = 1, 2.0
    sup.tend(["validator"])
    clock.now = 3.9
    sup.tend(["validator"])
    assert child.starts == 1  # the second restart waits 2 s
    clock.now = 4.0
    sup.tend(["validator"])
    assert child.starts == 2
    assert [(r["service"], r["cause"], r["exit_code"], r["number"], r["backoff_s"]) for r in sup.report()] == [
        ("validator", "exit", 2, 1, 1.0), ("validator", "exit", 1, 2, 2.0)]
    assert sup.report()[0]["last_log"] == "last words of validator" and sup.report()[0]["time"].endswith("Z")


def test_past_the_budget_the_run_fails_with_the_childs_failure():
    child = FakeChild("explorer", code=1)
    sup, clock = _supervisor(child, budget=1)
    sup.tend(["explorer"])
    clock.now = 1.0
    sup.tend(["explorer"])
    child.code, clock.now = 1, 2.0
    with pytest.raises(ChildFailed, match=r"explorer exited with code 1; its restarts are spent "
                                          r"\(run.restart_budget=1 within run.restart_window_s=100 s\)"):
        sup.tend(["explorer"])
    assert child.starts == 1 and len(sup.restarts) == 1


def test_a_finished_learner_is_left_alone_and_a_failed_one_restarts_with_its_rerun_args(capsys):
    learner = FakeChild("learner", code=0, finishes=True, rerun_args=["--resume"])
    sup, clock = _supervisor(learner)
    sup.tend(["learner"])
    assert sup.restarts == [] and learner.starts == 0
    learner.code = 3
    sup.tend(["learner"])
    assert "learner exited with code 3; restarting it with --resume in 1 s" in capsys.readouterr().out
    clock.now = 1.0
    sup.tend(["learner"])
    assert learner.starts == 1 and sup.restarts[0].exit_code == 3


def test_a_service_exiting_with_code_0_is_restarted_unless_it_finishes():
    child = FakeChild("streams", code=0)
    sup, _ = _supervisor(child)
    sup.tend(["streams"])
    assert [r.exit_code for r in sup.restarts] == [0]


def test_a_hung_service_is_killed_past_its_allowance_and_restarted_as_a_liveness_restart(capsys):
    child = FakeChild("archiver")
    sup, clock = _supervisor(child, allowance_s=10.0)
    sup.tend(["archiver"])  # up
    child.answer = None
    for clock.now in (5.0, 10.0, 15.0):
        sup.tend(["archiver"])
    assert not child.killed  # failing since 5: 10 s at most is allowed
    clock.now = 16.0
    sup.tend(["archiver"])
    assert not child.killed  # not probed again before 20: the last answer stands, still within 10 s
    clock.now = 20.0
    sup.tend(["archiver"])
    assert child.killed and sup.restarts[0].cause == "liveness" and sup.restarts[0].exit_code == -9
    assert "its /healthz failed for 15 s in a row, over run.liveness_s.archiver=10 s" in capsys.readouterr().out
    clock.now = 21.0
    sup.tend(["archiver"])
    assert child.starts == 1


def test_probes_are_spaced_by_probe_every_s():
    child = FakeChild("streams")
    sup, clock = _supervisor(child)
    for step in range(100):
        clock.now = step * 0.5
        sup.tend(["streams"])
    assert child.probes == 10  # 50 s at one probe per 5 s
    assert child.log_bounds == 100  # its log is bounded at every tend, probed or not


def test_a_service_that_never_answers_ready_is_killed_after_the_start_timeout():
    child = FakeChild("explorer", answer={"ready": False})
    sup, clock = _supervisor(child)
    for clock.now in (0.0, 10.0, 20.0, 30.0):
        sup.tend(["explorer"])
    assert not child.killed
    clock.now = 35.0
    sup.tend(["explorer"])
    assert child.killed and sup.restarts[0].cause == "liveness"


def test_the_policy_and_allowances_come_from_the_run_settings():
    plan = make_plan("smoke", ["run.restart_budget=7", "run.restart_backoff_max_s=30",
                               "run.liveness_s={validator: 42}"])
    sup = Supervisor.of({}, plan.run)
    assert sup.policy == RestartPolicy(budget=7, window_s=600.0, backoff_s=1.0, backoff_max_s=30.0)
    assert sup.liveness_s["validator"] == 42.0 and sup.liveness_s["learner"] == 300.0
    assert sup.start_timeout_s == plan.run.start_timeout_s


def test_the_last_log_line_skips_what_a_progress_bar_leaves_behind(tmp_path):
    log = tmp_path / "streams.log"
    log.write_text('{"event": "streams.batch", "n": 3}\n\x1b[2K\r 40%|████ | 4/10\n\b\x1b[?25h\n╰──────╯\n')
    assert Child("streams", [], {}, log).last_line() == "40%|████ | 4/10"
    log.write_text('{"event": "streams.batch", "n": 3}\n\b\x1b[?25h\n')
    assert Child("streams", [], {}, log).last_line() == '{"event": "streams.batch", "n": 3}'
