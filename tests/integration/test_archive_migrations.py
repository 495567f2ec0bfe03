"""Migrations on the real engine (chDB): applied once, recorded, idempotent; tables keep first occurrences."""
from __future__ import annotations

import pytest

from coevolve.services.archive.rows import COLUMNS
from coevolve.services.clickhouse.client import ArchiveError, connect
from coevolve.services.clickhouse.migrations import MIGRATIONS, migrate

pytestmark = pytest.mark.integration


def test_migrations_apply_once_and_record_versions(tmp_path):
    url = f"chdb://{tmp_path}/ch"
    with pytest.raises(ArchiveError, match="archive a run first"):
        connect(url, create=False).close()
    client = connect(url)  # applies every migration
    try:
        assert migrate(client) == []  # a second start applies nothing
        versions = client.query("SELECT version FROM coevolve.schema_migrations FINAL ORDER BY version").result_rows
        assert [v for (v,) in versions] == [v for v, _, _ in MIGRATIONS]
        tables = {r[0] for r in client.query("SHOW TABLES FROM coevolve").result_rows}
        assert set(COLUMNS) | {"schema_migrations"} <= tables
        for table, columns in COLUMNS.items():
            described = {r[0] for r in client.query(f"DESCRIBE TABLE coevolve.{table}").result_rows}
            assert set(columns) <= described, table
    finally:
        client.close()


def test_an_event_at_two_positions_keeps_the_first(tmp_path):
    client = connect(f"chdb://{tmp_path}/ch")
    try:
        row = ["s1", "run", 3, 7, 1, None, None, None, None, 1_795_000_000_000]
        cols = COLUMNS["steps"]
        client.insert("coevolve.steps", [row + [0, 9]], column_names=cols)
        client.insert("coevolve.steps", [[*row[:3], 8, *row[4:]] + [0, 5]], column_names=cols)  # earlier offset
        client.insert("coevolve.steps", [[*row[:3], 9, *row[4:]] + [0, 12]], column_names=cols)
        got = client.query("SELECT trajectory_count, log_offset FROM coevolve.steps FINAL").result_rows
        assert got == [(8, 5)]
        assert client.query("SELECT count() FROM coevolve.steps").result_rows[0][0] == 3
    finally:
        client.close()
