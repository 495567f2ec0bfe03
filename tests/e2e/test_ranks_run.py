"""The suite's interrupted-and-resumed run: `coevolve run --preset smoke --set learner.world_size=2`, the
learner training on two torchrun ranks (FSDP2, gloo) while rank 0 rolls out on one local `vllm serve`
(the in-process engine cannot share the ranks' process group), on the run's own embedded broker. SIGINT
after its first step stops it with exit 130 and an `interrupted` summary; `--resume` puts the run's log
back on its new broker from the archive before any service starts and continues the same run at the next
step: every step and trajectory is published once, every step trains, the resumed learner pushes its
checkpoint's weights (gathered from both ranks) to its new server through the weight transfer, the
summary counts both sessions and says `world_size: 2`, and the live signals of both sessions equal a
replay of the archive (the signal worker rebuilt its state from the restored log). Checked on the log as
the archive kept it. Every socket the first session's processes listen on, torchrun's rendezvous store
and the broker included, is on loopback."""
import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from coevolve.services.archive.restore import restore_log
from coevolve.services.clickhouse.client import chdb_url, connect
from coevolve.services.kafka.embedded import EmbeddedBroker
from tests.e2e.runs import EXE, events, trained_steps
from tests.faults.scenario import _signals, read_log
from tests.sockets import listening_sockets

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 3


@pytest.mark.timeout(1500)
def test_smoke_on_two_ranks_interrupted_and_resumed_publishes_every_step_once(tmp_path):
    cmd = [EXE, "run", "--preset", "smoke", "--workdir", str(tmp_path), "--run-id", "ranks-e2e",
           "--steps", str(STEPS), "--set", "learner.world_size=2"]
    log = tmp_path.parent / "first.log"
    with open(log, "w+") as out:
        first = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 900  # the first run on a machine warms the policy up first
        listening: set[tuple[str, int, str]] = set()
        while f"step 1/{STEPS}" not in log.read_text() and time.monotonic() < deadline:
            assert first.poll() is None, log.read_text()[-4000:]
            listening |= listening_sockets(first.pid)  # the rendezvous, the ranks', the server's, the services'
            time.sleep(0.5)
        first.send_signal(signal.SIGINT)
        assert first.wait(300) == 130, log.read_text()[-4000:]
    interrupted = json.loads((tmp_path / "summary.json").read_text())
    assert interrupted["state"] == "interrupted" and 1 <= interrupted["last_step"] < STEPS

    done = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"step {interrupted['last_step'] + 1}/{STEPS}" in done.stdout
    assert done.stdout.index("restored log ranks-e2e:") < done.stdout.index("started streams"), done.stdout[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    with EmbeddedBroker() as broker:  # the run's broker is gone: its log, as the archive kept it
        client = connect(chdb_url(tmp_path), create=False)
        try:
            restore_log(client, "coevolve", "ranks-e2e", broker.bootstrap)
        finally:
            client.close()
        raw = events(broker.bootstrap, "ranks-e2e", dedupe=False)
        found = events(broker.bootstrap, "ranks-e2e")
        replayed = _signals(tmp_path, summary, read_log(broker.bootstrap), "ranks-e2e")
    assert summary["state"] == "completed" and summary["world_size"] == 2 and summary["rollout"] == "vllm-server"
    assert summary["run_id"] == interrupted["run_id"] and summary["resumed"]
    assert summary["steps"] == STEPS and summary["trajectories"] == len(found["TrajectoryRecorded"])  # both sessions
    assert not replayed, replayed  # live signals of both sessions equal a replay of the archive
    # the worker started over the restored log and sent only the signals it lacked
    assert set(Counter(e["event_id"] for e in raw.get("SignalRaised", [])).values()) <= {1}
    assert Counter(e["step"] for e in raw["StepCompleted"]) == {s: 1 for s in range(1, STEPS + 1)}
    trajectories = Counter(e["event_id"] for e in raw["TrajectoryRecorded"])
    assert set(trajectories.values()) == {1}  # each published once, by rank 0
    per_step = Counter(t["step"] for t in found["TrajectoryRecorded"])
    # the preset's B x K, and K more for each flat group dynamic sampling replaced
    assert per_step == {e["step"]: 4 * (2 + e["resampled_groups"]) for e in found["StepCompleted"]}
    trained = trained_steps(found)
    assert trained == list(range(1, STEPS + 1)), summary["updates_silent"]  # two-rank updates, every step
    assert len(found.get("PolicyUpdated", [])) == len(trained) == summary["weight_updates"]["count"]
    # every push, each session's push of its starting weights included (the fresh run's, and the resumed
    # learner's reload of its checkpoint), gathers the two ranks' shards and reaches the server through the
    # weight transfer
    servers = (tmp_path / "runs" / "ranks-e2e" / "learner" / "servers").glob("*.log")
    finished = sum(log.read_text().count('"POST /finish_weight_update HTTP/1.1" 200') for log in servers)
    assert finished == len(trained) + 2
    logs = (tmp_path / "logs" / "learner.log").read_text()
    assert logs.count('"learner.rank_ready"') >= 2  # rank 1 of the first session and of the resumed one
    assert all(json.loads(line).get("slowest_rank") in (0, 1) for line in logs.splitlines()
               if '"learner.step"' in line and '"ranks"' in line)
    assert Path(tmp_path / "runs" / "ranks-e2e" / "learner" / "checkpoints" / "latest").is_file()
    assert listening, "no listening socket was seen"
    assert {s for s in listening if s[0] not in ("127.0.0.1", "::1")} == set()
