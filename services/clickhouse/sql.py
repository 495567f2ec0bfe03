"""Small helpers for building and running ClickHouse SQL: literals, paths, bulk literal inserts, JIT off."""
from __future__ import annotations

import contextlib
from pathlib import Path

JIT_SETTINGS = ("compile_expressions", "compile_aggregate_expressions", "compile_sort_description")


def literal(value) -> str:
    """A ClickHouse SQL literal for a str or an int."""
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_path(path: Path | str) -> str:
    """A file path as an absolute-path SQL literal (for `file(...)`)."""
    return literal(str(Path(path).resolve()))


def insert_rows(client, table: str, rows) -> None:
    """INSERT literal rows (str and int values): unlike client.insert, no per-process set-up cost."""
    rows = list(rows)
    for i in range(0, len(rows), 50_000):
        values = ",".join("(" + ",".join(map(literal, row)) + ")" for row in rows[i:i + 50_000])
        client.command(f"INSERT INTO {table} VALUES {values}")


@contextlib.contextmanager
def jit_off(client):
    """ClickHouse JIT-compiles an expression on its third use in a session. Queries that run once each
    pay for the compile and gain nothing: a replay that hit it ran at half speed. Off for the block
    (session settings), restored afterwards."""
    names = ", ".join(map(literal, JIT_SETTINGS))
    before = client.query(f"SELECT name, value FROM system.settings WHERE name IN ({names})").result_rows
    for name in JIT_SETTINGS:
        client.command(f"SET {name} = 0")
    try:
        yield
    finally:
        for name, value in before:
            client.command(f"SET {name} = {literal(value)}")
