"""Shared by the archive tests: read the broker's whole log, and compare it with the archive's tables."""
from __future__ import annotations

import datetime as dt

from coevolve.services.archive.rows import COLUMNS, ORIGIN, rows_for
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.topics import CATALOG


def read_whole_log(bootstrap: str) -> list:
    """Every decodable event on every catalog topic, in partition order."""
    consumer = EventConsumer(bootstrap, list(CATALOG), service="test-log")
    try:
        return consumer.drain(idle_s=1.5)
    finally:
        consumer.close()


def _norm(value):
    if isinstance(value, dict):
        return tuple(_norm(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dt.datetime):
        return int(value.replace(tzinfo=value.tzinfo or dt.timezone.utc).timestamp() * 1000)
    if isinstance(value, float):
        return round(value, 12)
    return value


def _content(table: str) -> list[str]:
    return [c for c in COLUMNS[table] if c not in ORIGIN]


def expected_tables(log: list) -> dict[str, set]:
    """The rows the archive must hold for this log: one per event_id, its first occurrence in (partition,
    offset) order (actions: one per event and position)."""
    out: dict[str, dict] = {}
    for item in sorted(log, key=lambda d: (d.topic, d.partition, d.offset)):
        for table, rows in rows_for(item.name, item.event, item.partition, item.offset).items():
            width = len(_content(table))
            for row in rows:
                key = tuple(row[:1]) if table != "actions" else (row[0], row[4])
                out.setdefault(table, {}).setdefault(key, _norm(row[:width]))
    return {t: set(rows.values()) for t, rows in out.items()}


def expected_rows(name: str, event: dict) -> dict[str, set]:
    """The rows, without provenance, that one event gives, per table."""
    return {table: {_norm(row[:len(_content(table))]) for row in rows}
            for table, rows in rows_for(name, event, -1, 0).items()}


def archived_tables(client, database: str = "coevolve") -> dict[str, set]:
    """What the archive holds, read FINAL, without provenance columns."""
    out = {}
    for table in COLUMNS:
        cols = _content(table)
        rows = client.query(f"SELECT {', '.join(cols)} FROM {database}.{table} FINAL").result_rows
        assert len(rows) == len(set(map(_norm, rows))), f"{table}: duplicate rows survive FINAL"
        if rows:
            out[table] = {_norm(r) for r in rows}
    return out


def raw_count(client, table: str, database: str = "coevolve") -> int:
    return client.query(f"SELECT count() FROM {database}.{table}").result_rows[0][0]
