"""Migrations on the real engine (chDB): applied once, recorded, idempotent; tables keep first occurrences;
an archive written under an earlier version upgrades in place and keeps its rows."""
from __future__ import annotations

import clickhouse_connect
import pytest

from coevolve.services.archive.rows import COLUMNS, rows_for
from coevolve.services.clickhouse.client import ArchiveError, connect
from coevolve.services.clickhouse.migrations import MIGRATIONS, migrate
from tests.events import NOW, sample_events

pytestmark = pytest.mark.integration

# The tables' columns as version 1 created them (migrations are never edited, so this stays true).
V1_COLUMNS = {
    "steps": ["event_id", "run_id", "step", "trajectory_count", "policy_version", "train_reward", "eval_score",
              "loss", "duration_seconds", "produced_at", "log_partition", "log_offset"],
    "explorations": ["event_id", "run_id", "step", "signal_id", "signal_kind", "task_id", "round", "context",
                     "tuples", "model", "produced_at", "log_partition", "log_offset"],
    "tasks": ["event_id", "task_id", "run_id", "step", "source", "verdict", "reason", "env", "instruction_turns",
              "initial_state", "involved_classes", "reference_solution", "signal_ids", "exploration_ids",
              "validation_score", "produced_at", "log_partition", "log_offset"],
}
V1_ROWS = {
    "steps": ["s-old", "run-old", 1, 16, 1, 0.25, 0.5, 0.9, 30.0, NOW, 0, 0],
    "explorations": ["x-old", "run-old", 1, "sig-1", "boundary", "t1", 0, "{}", [("mv", "{}", "ok", "t1")],
                     "m", NOW, 0, 0],
    "tasks": ["k-old", "syn-1", "run-old", 1, "synthesized", "rejected", "duplicate", "bfcl", ["do it"], "{}",
              ["GorillaFileSystem"], [["ls()"]], ["sig-1"], ["x-old"], 0.0, NOW, 0, 0],
}


def test_migrations_apply_once_and_record_versions(tmp_path):
    url = f"chdb://{tmp_path}/ch"
    with pytest.raises(ArchiveError, match="archive a run first"):
        connect(url, create=False).close()
    client = connect(url)  # applies every migration
    try:
        assert migrate(client) == []  # a second start applies nothing
        for statement in MIGRATIONS[-1][2]:  # as after a crash before the version was recorded: harmless
            client.command(statement.format(db="coevolve"))
        versions = client.query("SELECT version FROM coevolve.schema_migrations FINAL ORDER BY version").result_rows
        assert [v for (v,) in versions] == [v for v, _, _ in MIGRATIONS] == [1, 2, 3, 4, 5, 6]
        tables = {r[0] for r in client.query("SHOW TABLES FROM coevolve").result_rows}
        assert set(COLUMNS) | {"schema_migrations"} <= tables
        for table, columns in COLUMNS.items():
            described = {r[0] for r in client.query(f"DESCRIBE TABLE coevolve.{table}").result_rows}
            assert set(columns) <= described, table
    finally:
        client.close()


def test_an_archive_of_version_1_upgrades_and_keeps_its_rows(tmp_path):
    url = f"chdb://{tmp_path}/ch"
    (tmp_path / "ch").mkdir()
    client = clickhouse_connect.get_client(dsn=url)  # an archive as version 1 left it, rows included
    try:
        assert migrate(client, migrations=MIGRATIONS[:1]) == [1]
        for table, row in V1_ROWS.items():
            described = [r[0] for r in client.query(f"DESCRIBE TABLE coevolve.{table}").result_rows]
            assert described[:len(V1_COLUMNS[table]) + 1] == [*V1_COLUMNS[table], "archived_at"], table
            client.insert(f"coevolve.{table}", [row], column_names=V1_COLUMNS[table])
    finally:
        client.close()

    client = connect(url)  # what an archiver of this version does at start-up: apply versions 2 to 6
    try:
        versions = [v for (v,) in client.query("SELECT version FROM coevolve.schema_migrations FINAL "
                                               "ORDER BY version").result_rows]
        assert versions == [1, 2, 3, 4, 5, 6]
        step = client.query("SELECT event_id, train_reward, eval_success, duration_seconds, pool_size, tokens_trained, "
                            "synthesized_trained, staleness_max, blocked_seconds FROM coevolve.steps FINAL").result_rows
        # old row kept (its eval_score now eval_success), new fields null
        assert step == [("s-old", 0.25, 0.5, 30.0, None, None, None, None, None)]
        assert client.query("SELECT event_id, model, strategy, signal_ids FROM coevolve.explorations FINAL"
                            ).result_rows == [("x-old", "m", "signal-guided", [])]  # the Avro defaults
        assert client.query("SELECT event_id, reason, stage, stages, seed_task_id FROM coevolve.tasks FINAL"
                            ).result_rows == [("k-old", "duplicate", None, [], None)]
        assert client.query("SELECT count() FROM coevolve.evaluations").result_rows == [(0,)]

        events = sample_events()  # events of the new version land beside the old rows
        for name in ("StepCompleted", "ExplorationRecorded", "TaskChecked", "EvaluationCompleted", "PolicyUpdated"):
            for table, rows in rows_for(name, events[name], 0, 1).items():
                client.insert(f"coevolve.{table}", rows, column_names=COLUMNS[table])
        redelivered = {**events["StepCompleted"], "event_id": "s-old", "run_id": "run-old", "step": 1}
        client.insert("coevolve.steps", rows_for("StepCompleted", redelivered, 0, 0)["steps"],
                      column_names=COLUMNS["steps"])  # the old event again, at its old position
        assert client.query("SELECT count() FROM coevolve.steps FINAL").result_rows == [(2,)]
        assert client.query("SELECT pool_size, blocked_seconds FROM coevolve.steps FINAL WHERE event_id != 's-old'"
                            ).result_rows == [(120, 0.001)]
        assert client.query("SELECT stage, stages FROM coevolve.tasks FINAL WHERE event_id != 'k-old'").result_rows \
            == [("executable", [{"stage": "well_formed", "passed": True, "reason": "2 calls parse"},
                                {"stage": "executable", "passed": False, "reason": "reference call failed"}])]
        assert client.query("SELECT step, success_rate, scores FROM coevolve.evaluations FINAL").result_rows \
            == [(3, 0.5, [1.0, 0.5])]
        assert client.query("SELECT version, backend, servers, staleness FROM (SELECT version, backend, servers, "
                            "(SELECT staleness_max FROM coevolve.steps FINAL WHERE event_id != 's-old') AS staleness "
                            "FROM coevolve.policy_updates FINAL)").result_rows == [(3, "vllm-server", 2, 1)]
    finally:
        client.close()


def test_an_event_at_two_positions_keeps_the_first(tmp_path):
    client = connect(f"chdb://{tmp_path}/ch")
    try:
        cols = COLUMNS["steps"]
        base = dict(zip(cols, [None] * len(cols)), event_id="s1", run_id="run", step=3, trajectory_count=7,
                    policy_version=1, produced_at=NOW, log_partition=0)
        for count, offset in ((7, 9), (8, 5), (9, 12)):  # the second sits at the earliest offset
            row = {**base, "trajectory_count": count, "log_offset": offset}
            client.insert("coevolve.steps", [[row[c] for c in cols]], column_names=cols)
        got = client.query("SELECT trajectory_count, log_offset FROM coevolve.steps FINAL").result_rows
        assert got == [(8, 5)]
        assert client.query("SELECT count() FROM coevolve.steps").result_rows[0][0] == 3
    finally:
        client.close()
