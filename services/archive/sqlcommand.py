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
from coevolve.streams.replay import (ReplayResult, publish_signals, read_signal_file, read_signal_topic, report,
                                     write_jsonl)
from coevolve.streams.signals import Thresholds


def run_sql_replay(inputs: list[Path] | None, clickhouse: str | None, bootstrap: str | None, window: int,
                   success_threshold: float, rare_threshold: float, pattern_length: int, output: Path | None,
                   publish: str | None, compare: str | None, database: str = "coevolve") -> str:
    """Replay in ClickHouse SQL; return the same report `coevolve replay` prints."""
    thresholds = Thresholds(success_threshold, window, rare_threshold, pattern_length)
    if publish and not bootstrap:
        raise ValueError("--publish needs --bootstrap HOST:PORT")
    if bool(inputs) == bool(clickhouse):
        raise ValueError("--engine sql reads either --input FILES (embedded chDB) or --clickhouse URL (the archive)")
    reference = None
    if compare is not None:
        if Path(compare).exists():
            reference = read_signal_file(compare)
        elif bootstrap:
            reference = read_signal_topic(bootstrap, compare)
        else:
            raise ValueError(f"--compare {compare}: no such file (for a topic, give --bootstrap)")
    client = connect(clickhouse, database, create=False) if clickhouse else \
        clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        source = archive_source(database) if clickhouse else file_source(inputs)
        signals, stats = replay_sql(client, source, thresholds)
    finally:
        client.close()
    result = ReplayResult(signals, stats["events"], stats["seconds"],
                          {"engine": "sql", "valid": stats["valid"], "sql_seconds": round(stats["sql_seconds"], 3)})
    if output is not None:
        write_jsonl(result.signals, output)
    if publish:
        publish_signals(result.signals, bootstrap, publish)
    return report(result, reference)
