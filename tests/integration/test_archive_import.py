"""`coevolve archive import`: Avro log files into the archive, idempotently; the SQL replay of the
imported archive equals the Python replay of the files."""
from __future__ import annotations

import json

import fastavro
import pytest
from typer.testing import CliRunner

from coevolve.schemas.codec import HISTORY_DIR
from coevolve.schemas.container import LogWriter, read_log
from coevolve.services.archive.importer import import_files, log_files
from coevolve.services.archive.rows import TABLE_OF, rows_for
from coevolve.services.cli import app
from coevolve.services.clickhouse.client import connect
from coevolve.services.simulate import SimulationConfig, write_file
from coevolve.streams.replay.engine_python import replay_files
from coevolve.streams.replay.report import write_jsonl
from tests.events import NOW, sample_events
from tests.cli_output import plain
from tests.integration.archive_helpers import archived_tables, expected_rows, raw_count

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
        assert result.exit_code != 0 and reason in plain(result.output), result.output


LOOP_EVENTS = ("StepCompleted", "ExplorationRecorded", "TaskChecked", "EvaluationCompleted")


def _v1_steps(path) -> dict:
    """A StepCompleted file written under version 1 of the schema (before the learner's fields)."""
    schema = fastavro.parse_schema(json.loads((HISTORY_DIR / "StepCompleted.v1.avsc").read_text()))
    event = {"event_id": "old-step", "run_id": "old-run", "step": 2, "trajectory_count": 8, "policy_version": 2,
             "train_reward": 0.5, "eval_success": None, "loss": 0.3, "duration_seconds": 9.0, "produced_at": NOW}
    with open(path, "wb") as fh:
        fastavro.writer(fh, schema, [event])
    return event


def test_the_loops_events_import_with_every_field_and_old_files_too(tmp_path):
    events = sample_events()
    with LogWriter(tmp_path / "loop.avro") as writer:
        for name in LOOP_EVENTS:
            writer.write(name, events[name])
    old = _v1_steps(tmp_path / "old.avro")
    url = f"chdb://{tmp_path}/ch"
    paths = [tmp_path / f"loop.{name}.avro" for name in LOOP_EVENTS] + [tmp_path / "old.avro"]
    text = _import(url, *paths)
    assert "EvaluationCompleted=1" in text and "StepCompleted=2" in text
    first, _ = _snapshot(url)
    expected = {TABLE_OF[name]: expected_rows(name, events[name])[TABLE_OF[name]] for name in LOOP_EVENTS}
    assert first["evaluations"] == expected["evaluations"]
    assert first["tasks"] == expected["tasks"] and first["explorations"] == expected["explorations"]
    assert expected["steps"] < first["steps"] and len(first["steps"]) == 2  # the new step, as the archiver's row
    client = connect(url, create=False)
    try:
        got = client.query("SELECT step, loss, pool_size, blocked_seconds FROM coevolve.steps FINAL "
                           "WHERE event_id = 'old-step'").result_rows
    finally:
        client.close()
    assert got == [(old["step"], old["loss"], None, None)]  # the fields version 1 lacks, at their defaults
    _import(url, *paths)
    assert _snapshot(url)[0] == first  # idempotent


def test_signal_files_are_refused_before_anything_is_imported(tmp_path):
    with LogWriter(tmp_path / "run.avro") as writer:
        writer.write("EvaluationCompleted", sample_events()["EvaluationCompleted"])
        writer.write("SignalRaised", sample_events()["SignalRaised"])
    url = f"chdb://{tmp_path}/ch"
    result = CliRunner().invoke(app, ["archive", "import", "--clickhouse", url,
                                      "--input", str(tmp_path / "run.EvaluationCompleted.avro"),
                                      "--input", str(tmp_path / "run.SignalRaised.avro")])
    assert result.exit_code != 0 and "SignalRaised files cannot be imported" in plain(result.output), result.output
    client = connect(url, create=False)
    try:
        assert client.query("SELECT count() FROM coevolve.evaluations").result_rows == [(0,)]
    finally:
        client.close()


def test_a_streamed_import_for_a_server_stores_what_the_engines_own_read_stores(tmp_path):
    """A server cannot read the client's files: the client decodes them and sends the rows. The archive it
    builds equals the one chDB builds reading the files itself, an older schema's file and a run suffix
    included."""
    write_file(SimulationConfig(steps=3, tasks=10, batch_tasks=5, group_size=4), tmp_path / "run.avro")
    events = sample_events()
    with LogWriter(tmp_path / "loop.avro") as writer:
        for name in LOOP_EVENTS:
            writer.write(name, events[name])
    _v1_steps(tmp_path / "old.avro")
    paths = [tmp_path / "run.avro", *(tmp_path / f"loop.{name}.avro" for name in LOOP_EVENTS), tmp_path / "old.avro"]
    archives = {}
    for streamed in (False, True):
        url = f"chdb://{tmp_path}/ch-{streamed}"
        client = connect(url)
        try:
            counts = import_files(client, paths, run_suffix="-x", streamed=streamed)
        finally:
            client.close()
        archives[streamed] = (counts, _snapshot(url)[0])
    assert archives[True] == archives[False]
    counts, tables = archives[True]
    assert counts["TrajectoryRecorded"] == len(tables["trajectories"]) > 0 and counts["StepCompleted"] == 3 + 1 + 1
    assert all(row[0].endswith("-x") for row in tables["trajectories"])
