"""A workdir holds many runs: a new `coevolve run` starts a new one, `--resume` continues the latest."""
import pytest

from coevolve.services.run.loop import resolve_run
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
