"""An archive URL's password shows in no log line, output or error of the commands that take one, and
the commands take the URL from CLICKHOUSE_URL (a Kubernetes Secret) as well as from --clickhouse."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from coevolve.services.simulate import SimulationConfig, publish, write_file

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "s3cret-Pa55"


def coevolve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `coevolve ARGS` in a fresh process (chDB holds one directory per process); stdout and stderr
    (the JSON logs) together in .stdout."""
    environ = {k: v for k, v in os.environ.items() if "CLICKHOUSE" not in k} | (env or {})
    return subprocess.run([sys.executable, "-c", "from coevolve.services.cli import main; main()", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ, timeout=180)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_archive_url_with_a_password_is_shown_redacted(bootstrap, tmp_path):
    # chDB ignores query arguments, so a password= argument runs every command for real.
    url = f"chdb://{tmp_path}/ch?password={SECRET}"
    shown = f"chdb://{tmp_path}/ch?password=***"
    sim = SimulationConfig(steps=3, tasks=10, batch_tasks=5, group_size=4)
    publish(sim, bootstrap)
    archived = coevolve("archiver", "--bootstrap", bootstrap, "--clickhouse", url, "--idle-exit", "2",
                        "--metrics-port", "-1")
    assert archived.returncode == 0, archived.stdout
    assert '"event": "archiver.started"' in archived.stdout and f"into {shown}" in archived.stdout
    log = tmp_path / "run.avro"
    write_file(sim, log)
    imported = coevolve("archive", "import", "--input", str(log), "--run-suffix", "-b",
                        env={"CLICKHOUSE_URL": url})  # the URL from the environment, as in a Job
    assert imported.returncode == 0, imported.stdout
    assert "TrajectoryRecorded=" in imported.stdout and f"into {shown}" in imported.stdout
    replayed = coevolve("replay", "--no-evidence", "--output", str(tmp_path / "s.jsonl"),
                        env={"CLICKHOUSE_URL": url})
    assert replayed.returncode == 0, replayed.stdout
    assert (tmp_path / "s.jsonl").read_text().count("\n") > 0
    analyzed = coevolve("analyze", "--clickhouse", url, "--workdir", str(tmp_path / "w"))
    assert analyzed.returncode == 0, analyzed.stdout
    for result in (archived, imported, replayed, analyzed):
        assert SECRET not in result.stdout, result.args


@pytest.mark.parametrize("command", [["archiver", "--bootstrap", "127.0.0.1:9"], ["archive", "import"],
                                     ["replay", "--engine", "sql"], ["analyze"]],
                         ids=["archiver", "import", "replay", "analyze"])
def test_a_server_url_password_is_in_no_error(command, tmp_path):
    url = f"http://coevolve:{SECRET}@127.0.0.1:{closed_port()}/"
    if command[0] == "archive":
        write_file(SimulationConfig(steps=1, tasks=2, batch_tasks=2, group_size=2), tmp_path / "run.avro")
        command = [*command, "--input", str(tmp_path / "run.avro")]
    for env, flags in (({}, ["--clickhouse", url]), ({"CLICKHOUSE_URL": url}, [])):
        result = coevolve(*command, *flags, env=env)
        assert result.returncode == 2, result.stdout  # a usage error, not a traceback
        assert "http://***@127.0.0.1" in result.stdout, result.stdout  # the URL, redacted
        assert SECRET not in result.stdout
