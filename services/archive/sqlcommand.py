"""`coevolve replay --engine sql`: the replay command's flags and outputs, with the SQL engine.

Reads the archive (`--clickhouse URL`, for when the broker no longer holds the log) or Avro files
(`--input`, read by embedded chDB); writes, publishes, compares and reports with the Python replay's
own functions, so both engines' outputs compare line for line.
"""
from __future__ import annotations

from pathlib import Path

import clickhouse_connect

from coevolve.services.archive.sqlreplay import archive_source, file_source, replay_sql
from coevolve.services.archive.store import connect
from coevolve.streams.replay import ReplayResult, deliver, load_reference
from coevolve.streams.signals import Thresholds


def run_sql_replay(inputs: list[Path] | None, clickhouse: str | None, bootstrap: str | None, window: int,
                   success_threshold: float, rare_threshold: float, pattern_length: int, output: Path | None,
                   publish: str | None, compare: str | None, database: str = "coevolve") -> str:
    """Replay in ClickHouse SQL; return the same report `coevolve replay` prints."""
    thresholds = Thresholds(success_threshold, window, rare_threshold, pattern_length)
    if bool(inputs) == bool(clickhouse):
        raise ValueError("--engine sql reads either --input FILES (embedded chDB) or --clickhouse URL (the archive)")
    reference = load_reference(compare, bootstrap, publish)
    client = connect(clickhouse, database, create=False) if clickhouse else \
        clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        source = archive_source(database) if clickhouse else file_source(inputs)
        signals, stats = replay_sql(client, source, thresholds)
    finally:
        client.close()
    result = ReplayResult(signals, stats["events"], stats["seconds"],
                          {"engine": "sql", "valid": stats["valid"], "sql_seconds": round(stats["sql_seconds"], 3)})
    return deliver(result, output, publish, bootstrap, reference)
