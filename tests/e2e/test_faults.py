"""`coevolve run --preset smoke` on the rollout fleet with the validator, explorer, signal worker and
learner each SIGKILLed once where a crash costs the most, the fleet's server SIGKILLed during a push, the
broker unreachable from the learner for longer than its retries while it publishes a step, the explorer
starting on a backlog of closed periods, a dual-pass call that would compute for minutes, the run's
embedded broker SIGKILLed mid-run, the learner's and the validator's tool hosts SIGKILLed while idle, and
the validator's catalog read after its restart finding no partition (tests/faults/): the broker comes back with the
run's log and every service, the call is stopped at the tool host's limit, the learner stops with a message at each
failed step and resumes, the run completes, its summary agrees with the broker, each update was applied
once, every task has one verdict on the topic and in the archive, no validated task leaves the pool, the
live signals equal a replay of the archive, and no trajectory is counted twice."""
import pytest

from tests.faults.scenario import FAULTS, OTHERS, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(1800)  # a smoke run with eight restarts and the broker's, on a loaded machine
def test_a_run_through_kills_a_dead_server_an_outage_and_a_backlog_loses_and_doubles_nothing(tmp_path):
    outcome = run(tmp_path, "faults-e2e")
    assert outcome.returncode == 0, outcome.output[-6000:]
    assert outcome.fired == sorted(FAULTS + OTHERS), outcome.output[-6000:]
    assert not outcome.problems, "\n".join(outcome.problems)
    for name in FAULTS:
        assert f"{name} exited with code -9; restarting it" in outcome.output
    assert "learner exited with code 1; restarting it with --resume" in outcome.output
    assert "the broker exited with code -9: stopping the services" in outcome.output
    assert "validator exited with code 1; restarting it" in outcome.output
