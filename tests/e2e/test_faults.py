"""`coevolve run --preset smoke` with the validator, explorer, signal worker and learner each SIGKILLed
once where a crash costs the most, and a dual-pass call that would compute for minutes (tests/faults/):
the call is stopped at the tool host's limit, the run completes, its summary agrees with the broker,
every task has one verdict on the topic and in the archive, no validated task leaves the pool, the live
signals equal a replay of the archive, and no trajectory is counted twice."""
import pytest

from coevolve.services.kafka.embedded import EmbeddedBroker
from tests.faults.scenario import FAULTS, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(1800)  # a smoke run with four restarts, on a loaded machine
def test_a_run_whose_services_are_each_killed_once_loses_and_doubles_nothing(tmp_path):
    with EmbeddedBroker() as broker:
        outcome = run(tmp_path, broker.bootstrap, "faults-e2e")
    assert outcome.returncode == 0, outcome.output[-6000:]
    assert outcome.fired == sorted(FAULTS + ("stall",)), outcome.output[-6000:]
    assert not outcome.problems, "\n".join(outcome.problems)
    for name in FAULTS:
        assert f"{name} exited with code -9; restarting it" in outcome.output
    assert "with --resume" in outcome.output
