"""Each service that plays episodes runs them within a tool host bounded by its `limits` (envs/host.py);
the host process itself starts with the first workspace, so nothing starts here."""
import pytest

from coevolve.services.agent.config import BackendConfig, EpisodeLimits
from coevolve.services.envs import host
from coevolve.services.explorer.config import ExplorerSettings
from coevolve.services.explorer.service import Explorer
from coevolve.services.learner.config import LearnerConfig, LearnerSettings
from coevolve.services.learner.loop.service import Learner
from coevolve.services.validator.config import ValidatorSettings
from coevolve.services.validator.service import Validator

LIMITS = EpisodeLimits(call_limit_s=3.0, call_memory_mb=300)


@pytest.mark.parametrize("build", [
    lambda tmp: Explorer(ExplorerSettings(limits=LIMITS)),
    lambda tmp: Validator(ValidatorSettings(limits=LIMITS)),
    lambda tmp: Learner(LearnerSettings(LearnerConfig(workdir=tmp), limits=LIMITS,
                                        backend=BackendConfig(model="tiny-random", backend="transformers"))),
], ids=["explorer", "validator", "learner"])
def test_a_service_runs_within_a_tool_host_bounded_by_its_limits(build, tmp_path):
    service = build(tmp_path)
    with service.scope as bound:
        assert host.installed() is bound
        assert (bound.limit_s, bound.memory_mb) == (3.0, 300)
    assert host.installed() is None


def test_a_limit_of_zero_runs_tool_calls_in_the_process_itself():
    service = Explorer(ExplorerSettings(limits=EpisodeLimits(call_limit_s=0)))
    with service.scope as bound:
        assert bound is None and host.installed() is None
