"""`coevolve archive import`: Avro log files into the archive, idempotently; the SQL replay of the
imported archive equals the Python replay of the files."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from coevolve.schemas.container import read_log
from coevolve.services.archive.importer import import_files, log_files
from coevolve.services.archive.rows import rows_for
from coevolve.services.cli import app
from coevolve.services.clickhouse.client import connect
from coevolve.services.simulate import SimulationConfig, write_file
from coevolve.streams.replay.engine_python import replay_files
from coevolve.streams.replay.report import write_jsonl
from tests.integration.archive_helpers import archived_tables, raw_count

pytestmark = pytest.mark.integration


def _snapshot(url: str) -> tuple[dict, int]:
    client = connect(url, create=False)
    try:
        return archived_tables(client), raw_count(client, "trajectories")
    finally:
        client.close()


def _import(url: str, *paths) -> str:
    args = ["archive", "import", "--clickhouse", url]
    for path in paths:
        args += ["--input", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.output


def _replay(url: str, out) -> bytes:
    result = CliRunner().invoke(app, ["replay", "--clickhouse", url, "--no-evidence", "--output", str(out)])
    assert result.exit_code == 0, result.output
    return out.read_bytes()


def test_importing_a_log_twice_gives_the_same_archive_and_signals(tmp_path):
    log = tmp_path / "run.avro"
    counts, _files = write_file(SimulationConfig(steps=8, tasks=20, batch_tasks=10, group_size=6, seed=4), log)
    url = f"chdb://{tmp_path}/ch"
    text = _import(url, log)
    assert f"TrajectoryRecorded={counts['TrajectoryRecorded']}" in text and "StepCompleted=8" in text
    first, raw_first = _snapshot(url)
    expected = {}
    for name, event in read_log(log_files([log])):
        for table, rows in rows_for(name, event, -1, 0).items():
            expected[table] = expected.get(table, 0) + len(rows)
    assert {t: len(rows) for t, rows in first.items()} == expected
    signals = _replay(url, tmp_path / "first.jsonl")

    _import(url, log)  # again: the same rows are inserted, and collapse into the stored ones
    again, raw_again = _snapshot(url)
    assert raw_first <= raw_again <= 2 * raw_first  # inserted again (a background merge may collapse them) ...
    assert again == first  # ... and the archive read FINAL is unchanged
    assert _replay(url, tmp_path / "again.jsonl") == signals

    python = replay_files([log])
    write_jsonl(python.signals, tmp_path / "python.jsonl", evidence=False)
    assert sorted(signals.splitlines()) == sorted((tmp_path / "python.jsonl").read_bytes().splitlines())
    assert len(signals.splitlines()) == len(python.signals) > 20


def test_a_run_suffix_loads_a_log_as_another_run(tmp_path):
    log = tmp_path / "run.avro"
    write_file(SimulationConfig(steps=3, tasks=10, batch_tasks=5, group_size=4), log)
    client = connect(f"chdb://{tmp_path}/ch")
    try:
        once = import_files(client, [log])
        assert import_files(client, [log], run_suffix="-b") == once
        runs = client.query("SELECT run_id, count() FROM coevolve.trajectories FINAL GROUP BY run_id "
                            "ORDER BY run_id").result_rows
    finally:
        client.close()
    assert [r[0] for r in runs] == ["sim-run", "sim-run-b"] and runs[0][1] == runs[1][1]


def test_files_that_are_not_importable_logs_are_refused_with_the_reason(tmp_path):
    url = f"chdb://{tmp_path}/ch"
    (tmp_path / "notes.avro").write_text("not avro")
    for path, reason in ((tmp_path / "missing.avro", "no such file"), (tmp_path / "notes.avro", "not an Avro")):
        result = CliRunner().invoke(app, ["archive", "import", "--clickhouse", url, "--input", str(path)])
        assert result.exit_code != 0 and reason in result.output, result.output
