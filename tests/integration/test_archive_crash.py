"""An archiver process killed (SIGKILL) mid-batch and restarted leaves the archive exactly equal to the log."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.services.clickhouse.client import connect
from coevolve.services.simulate import SimulationConfig, publish
from tests.integration.archive_helpers import archived_tables, expected_tables, read_whole_log

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def spawned():
    """Processes the test starts; any still running at the end (a failed test) are killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _archiver(bootstrap: str, url: str, *extra: str) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).with_name("coevolve")), "--log-level", "info", "archiver",
           "--bootstrap", bootstrap, "--clickhouse", url, "--group-id", "crash-test", "--batch-size", "700",
           "--metrics-port", "-1", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@pytest.mark.timeout(240)
def test_archiver_killed_mid_batch_restarts_exactly(bootstrap, tmp_path, spawned):
    url = f"chdb://{tmp_path}/ch"
    kills = 0
    for run in ("a", "b"):  # each round: new events arrive, the archiver stores a batch and is killed
        publish(SimulationConfig(run_id=f"run-{run}", steps=6, tasks=20, batch_tasks=8, group_size=8), bootstrap)
        proc = _archiver(bootstrap, url, "--idle-exit", "20")
        spawned.append(proc)
        for line in proc.stderr:  # SIGKILL right after a batch is stored: before or during its commit
            if '"archiver.stored"' in line:
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
                break
        proc.wait(60)
        assert proc.returncode == -signal.SIGKILL
    publish(SimulationConfig(run_id="run-c", steps=6, tasks=20, batch_tasks=8, group_size=8), bootstrap)
    final = _archiver(bootstrap, url, "--idle-exit", "2")
    spawned.append(final)
    _, err = final.communicate(timeout=120)
    assert final.returncode == 0, err[-2000:]
    assert kills == 2

    log = read_whole_log(bootstrap)
    client = connect(url, create=False)
    try:
        assert archived_tables(client) == expected_tables(log)
    finally:
        client.close()
