"""`coevolve replay --engine sql`: the replay command's flags and outputs, with the SQL engine.

Reads the archive (`--clickhouse URL`, for when the broker no longer holds the log) or Avro files
(`--input`, read by embedded chDB); writes, publishes, compares and reports with the Python replay's
own functions, so both engines' outputs compare line for line.
"""
from __future__ import annotations

from pathlib import Path

import clickhouse_connect

from coevolve.services.archive.sqllines import replay_sql_lines
from coevolve.services.archive.sqlreplay import archive_source, file_source, replay_sql
from coevolve.services.archive.store import connect
from coevolve.streams.replay import ReplayResult, deliver, load_reference, summary_lines
from coevolve.streams.signals import KINDS, Thresholds


def run_sql_replay(inputs: list[Path] | None, clickhouse: str | None, bootstrap: str | None, window: int,
                   success_threshold: float, rare_threshold: float, pattern_length: int, output: Path | None,
                   publish: str | None, compare: str | None, database: str = "coevolve", evidence: bool = True) -> str:
    """Replay in ClickHouse SQL; return the same report `coevolve replay` prints. Without evidence, and
    with nothing to publish or compare, ClickHouse formats the output lines itself."""
    thresholds = Thresholds(success_threshold, window, rare_threshold, pattern_length)
    if bool(inputs) == bool(clickhouse):
        raise ValueError("--engine sql reads either --input FILES (embedded chDB) or --clickhouse URL (the archive)")
    reference = load_reference(compare, bootstrap, publish)
    client = connect(clickhouse, database, create=False) if clickhouse else \
        clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        source = archive_source(database) if clickhouse else file_source(inputs)
        if not evidence and not publish and reference is None:
            local = clickhouse is None or clickhouse.startswith("chdb:")
            return _lines_report(replay_sql_lines(client, source, thresholds, output, local))
        signals, stats = replay_sql(client, source, thresholds, evidence=evidence)
    finally:
        client.close()
    result = ReplayResult(signals, stats["events"], stats["seconds"], _outcomes(stats))
    return deliver(result, output, publish, bootstrap, reference, evidence)


def _outcomes(stats: dict) -> dict:
    return {"engine": "sql", "valid": stats["valid"], "sql_seconds": round(stats["sql_seconds"], 3)}


def _lines_report(stats: dict) -> str:
    """The report `report` prints, from the counts the SQL replay took."""
    counts = {kind: stats["counts"][kind] for kind in KINDS}
    return "\n".join(summary_lines(stats["events"], stats["seconds"], _outcomes(stats), counts))
