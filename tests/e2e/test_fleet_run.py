"""`coevolve run --preset smoke` with the rollout fleet and bounded staleness: the learner starts a
`vllm serve` process, rolls out on it over HTTP, pushes every update through vLLM's weight-transfer
API, and generates each next step's rollouts while a step trains (max_policy_lag 1)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.services.kafka.embedded import EmbeddedBroker
from tests.e2e.test_run import EXE, _events

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _archived_policy_updates(workdir: Path) -> int:
    """Rows of the archive's policy_updates table (chdb opens one path per process: a child reads it)."""
    code = ("import sys; from coevolve.services.clickhouse.client import chdb_url, connect; "
            "c = connect(chdb_url(sys.argv[1]), create=False); "
            "print(c.query('SELECT count() FROM coevolve.policy_updates FINAL').result_rows[0][0]); c.close()")
    out = subprocess.run([sys.executable, "-c", code, str(workdir)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


@pytest.mark.timeout(900)
def test_smoke_on_the_fleet_with_lag_1_keeps_every_rollout_within_one_version(tmp_path):
    with EmbeddedBroker() as broker:
        done = subprocess.run([EXE, "run", "--preset", "smoke", "--workdir", str(tmp_path), "--bootstrap",
                               broker.bootstrap, "--run-id", "fleet-e2e", "--set", "learner.backend=vllm-server",
                               "--set", "learner.max_policy_lag=1"], capture_output=True, text=True, timeout=840)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        events = _events(broker.bootstrap, "fleet-e2e")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["state"] == "completed" and summary["rollout"] == "vllm-server"
    steps = {e["step"]: e for e in events["StepCompleted"]}
    assert sorted(steps) == [1, 2, 3]
    updates = events.get("PolicyUpdated", [])
    trained = [s for s in steps.values() if s["loss"] is not None]
    assert len(updates) == len(trained) == summary["weight_updates"]["count"]
    assert sorted(u["version"] for u in updates) == list(range(1, len(updates) + 1))
    assert all(u["backend"] == "vllm-server" and u["servers"] == 1 and u["bytes"] > 0 for u in updates)
    for t in events["TrajectoryRecorded"]:  # the policy each step updated, less the one that made a rollout
        step = steps[t["step"]]
        updated = step["policy_version"] - (step["loss"] is not None)
        assert 0 <= updated - t["policy_version"] <= 1, (t["step"], t["policy_version"], step["policy_version"])
    assert summary["policy_lag"]["max"] in (None, 0, 1)
    assert _archived_policy_updates(tmp_path) == len(updates)
