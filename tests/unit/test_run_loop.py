"""A workdir holds many runs (a new `coevolve run` starts a new one, `--resume` continues the latest);
the learner's starting policy is prepared before the services start and shared as configured; a
service that exits is started again, up to run.restarts times."""
import pytest

from coevolve.services.run.children import Child, ChildFailed
from coevolve.services.run.loop import Session, make_children, prepare_policy, resolve_run, revive
from coevolve.services.run.plan import make_plan
from coevolve.services.runtime.config import ConfigError


def test_runs_in_one_workdir_get_new_ids_and_resume_takes_the_latest(tmp_path):
    plan = make_plan("smoke")
    with pytest.raises(ConfigError, match="--resume: .*run.json does not exist"):
        resolve_run(tmp_path, plan, resume=True, run_id=None)
    first = resolve_run(tmp_path, plan, resume=False, run_id="first")
    second = resolve_run(tmp_path, plan, resume=False, run_id=None)
    assert first == "first" and second != first
    assert resolve_run(tmp_path, plan, resume=True, run_id=None) == second


def test_an_explicit_run_id_that_exists_must_be_resumed(tmp_path):
    plan = make_plan("smoke")
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    with pytest.raises(ConfigError, match="already exists.*--resume"):
        resolve_run(tmp_path, plan, resume=False, run_id="mine")


def _session(tmp_path, *overrides: str) -> Session:
    plan = make_plan("smoke", list(overrides))
    return Session(plan, tmp_path, resolve_run(tmp_path, plan, resume=False, run_id="r"), False,
                   bootstrap="127.0.0.1:1")


def test_the_processes_sharing_the_policy_get_the_learners_starting_model(tmp_path):
    s = _session(tmp_path, "learner.warmup_steps=0", "run.shared_policy=validator")
    prepare_policy(s)  # a real `coevolve learner --policy-only`: no warm-up, so the configured model
    assert s.policy == "tiny-random"
    children = make_children(s)
    assert children["validator"].env["VALIDATOR_MODEL"] == "tiny-random"
    assert "EXPLORER_MODEL" not in children["explorer"].env


def test_a_policy_that_cannot_be_prepared_fails_the_run_with_its_log(tmp_path):
    s = _session(tmp_path, "learner.model=no-such-model", "learner.warmup_steps=5")
    with pytest.raises(ChildFailed, match=r"preparing the policy failed \(exit code [1-9].*warmup.log"):
        prepare_policy(s)
    assert "no-such-model" in (tmp_path / "logs" / "warmup.log").read_text()


def test_a_service_that_exits_is_restarted_up_to_run_restarts_then_fails_the_run(tmp_path):
    s = _session(tmp_path, "run.restarts=1")
    # A real `coevolve` process that exits at once (an unknown command: click's usage error, code 2).
    crashing = Child("validator", ["no-such-service"], {}, tmp_path / "logs" / "validator.log").start()
    s.children = {"validator": crashing}
    first = crashing.process
    first.wait()
    revive(s, ["validator"])
    assert s.restarts == {"validator": 1} and crashing.process is not first
    crashing.process.wait()
    assert crashing.log_path.read_text().count("No such command") == 2  # one log, appended by both
    with pytest.raises(ChildFailed, match=r"validator exited with code 2; its log is .*validator.log"):
        revive(s, ["validator"])
    assert s.restarts == {"validator": 1}


def test_the_learner_is_never_restarted(tmp_path):
    s = _session(tmp_path)
    learner = Child("learner", ["no-such-service"], {}, tmp_path / "logs" / "learner.log").start()
    s.children = {"learner": learner}
    learner.process.wait()
    with pytest.raises(ChildFailed, match="learner exited with code 2"):
        revive(s, ["learner"])
    assert s.restarts == {}
