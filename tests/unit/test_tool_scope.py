"""Each service that plays episodes runs them within a tool host bounded by its `limits` (envs/host.py),
and its /metrics counts that host's stopped calls, restarts and lost workspaces; the host process itself
starts with the first workspace, so nothing starts here."""
import pytest
from prometheus_client import generate_latest

from coevolve.services.agent.config import BackendConfig, EpisodeLimits
from coevolve.services.envs import hosts
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
        assert hosts.installed() is bound
        assert (bound.limit_s, bound.memory_mb) == (3.0, 300)
        bound.stopped, bound.restarts, bound.lost = 2, 1, 1
        assert _counts(service) == {"calls_stopped": 2.0, "restarts": 1.0, "workspaces_lost": 1.0}
    assert hosts.installed() is None
    assert _counts(service) == {"calls_stopped": 0.0, "restarts": 0.0, "workspaces_lost": 0.0}


def _counts(service) -> dict[str, float]:
    """The tool_host_*_total samples of the service's /metrics."""
    lines = generate_latest(service.registry).decode().splitlines()
    return {name[len("tool_host_"):-len("_total")]: float(value) for name, value in
            (line.split() for line in lines if line.startswith("tool_host_"))}


def test_a_limit_of_zero_runs_tool_calls_in_the_process_itself():
    service = Explorer(ExplorerSettings(limits=EpisodeLimits(call_limit_s=0)))
    with service.scope as bound:
        assert bound is None and hosts.installed() is None
