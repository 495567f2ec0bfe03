"""The embedded broker's log survives it: `coevolve run --preset smoke` whose broker is SIGKILLed after the
first step comes back with the run's log and every service, is then interrupted, and `--resume` goes on
with the topics it had. Checked on the log itself, put back once more on a broker of the test's own:
every step once with all its trajectories, one verdict per task, live signals equal to a replay of the
archive and each on the log once (the signal worker starts over the restored log), summary.json counting
both sessions."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from coevolve.services.archive.restore import restore_log
from coevolve.services.clickhouse.client import chdb_url, connect
from coevolve.services.kafka.embedded import EmbeddedBroker
from tests.e2e.runs import EXE
from tests.faults.scenario import _signals, _steps_and_trajectories, _verdicts, read_log

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RUN = "broker-e2e"


def _tansu_of(pid: int) -> int:
    """The pid of the broker the run started (a child of the run's process)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name, ppid = stat[stat.index("(") + 1:stat.rindex(")")], int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid == pid and name == "tansu":
                return int(entry.name)
    raise AssertionError(f"no tansu process under the run (pid {pid})")


def _run(workdir: Path, *extra: str, on_line=None, timeout_s: float = 900) -> tuple[int, str]:
    """`coevolve run --preset smoke` in `workdir`; `on_line(process, line)` sees each line as it comes."""
    process = subprocess.Popen([EXE, "run", "--preset", "smoke", "--workdir", str(workdir), *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    timer = threading.Timer(timeout_s, process.kill)
    timer.start()
    try:
        for line in process.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(process, line)
        return process.wait(), "".join(lines)
    finally:
        timer.cancel()


@pytest.mark.timeout(2400)
def test_a_killed_broker_and_a_resume_keep_the_runs_log_whole(tmp_path):
    fired: dict[str, float] = {}

    def faults(process: subprocess.Popen, line: str) -> None:
        if line.startswith("step 1/") and "broker" not in fired:
            time.sleep(5.0)  # past the archiver's batch: the kill lands mid-step, not in the publish window
            os.kill(_tansu_of(process.pid), signal.SIGKILL)
            fired["broker"] = time.monotonic()
        elif line.startswith("step 2/") and "interrupt" not in fired:
            process.send_signal(signal.SIGINT)
            fired["interrupt"] = time.monotonic()

    code, first = _run(tmp_path, "--run-id", RUN, on_line=faults)
    assert code == 130 and set(fired) == {"broker", "interrupt"}, first[-6000:]
    assert "the broker exited with code -9: stopping the services" in first, first[-6000:]
    assert f"restored log {RUN}:" in first, first[-6000:]
    interrupted = json.loads((tmp_path / "summary.json").read_text())
    assert [r["service"] for r in interrupted["restarts"]] == ["broker"], interrupted["restarts"]

    code, second = _run(tmp_path, "--resume")
    assert code == 0, second[-6000:]
    assert second.index(f"restored log {RUN}:") < second.index("started streams"), second[-6000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["state"] == "completed" and summary["resumed"]

    with EmbeddedBroker() as broker:
        client = connect(chdb_url(tmp_path), create=False)
        try:
            restore_log(client, "coevolve", RUN, broker.bootstrap)
        finally:
            client.close()  # the checks open the archive themselves
        log = read_log(broker.bootstrap)
        problems = _steps_and_trajectories(tmp_path, summary, log, RUN)  # both sessions' steps, each once
        problems += _verdicts(tmp_path, summary, log, RUN, "")
        problems += _signals(tmp_path, summary, log, RUN)
    assert not problems, "\n".join(problems)
    signals = [e["event_id"] for e in log["SignalRaised"] if e["run_id"] == RUN]
    assert len(signals) == len(set(signals)), "the worker that started over sent signals the log held"
    steps = sorted({e["step"] for e in log["StepCompleted"] if e["run_id"] == RUN})
    assert steps == [1, 2, 3] and summary["steps"] == 3
