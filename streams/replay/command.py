"""The `coevolve replay` command: read a source, run an engine, hand the signals to the reports.

Python engine: Avro files (chDB or fastavro decoder) or the topics. SQL engine: the archive
(`--clickhouse URL`, for when the broker no longer holds the log) or Avro files read by embedded chDB.
Both write, publish, compare and report with the same functions (`report.py`), so their outputs compare
line for line. Without evidence, and with nothing to publish or compare, ClickHouse formats the output
lines itself (`sql_lines.py`), the fastest path.
"""
from __future__ import annotations

from coevolve.services.clickhouse.client import connect
from coevolve.streams.replay.config import ReplayConfig
from coevolve.streams.replay.engine_python import replay_files, replay_topics
from coevolve.streams.replay.engine_sql import replay_sql
from coevolve.streams.replay.report import ReplayResult, deliver, load_reference, summary_lines
from coevolve.streams.replay.sql_lines import replay_sql_lines
from coevolve.streams.replay.sql_stages import archive_source, file_source
from coevolve.streams.rules import KINDS


def run_replay(cfg: ReplayConfig) -> str:
    """Replay as `cfg` says; write or publish the signals; return the report."""
    reference = load_reference(cfg.compare, cfg.bootstrap, cfg.publish)
    if cfg.sql:
        return _run_sql(cfg, reference)
    th = cfg.thresholds()
    if cfg.inputs:  # published signals carry their evidence whatever the output file holds
        result = replay_files(cfg.inputs, th, cfg.limits(), workers=cfg.workers, decoder=cfg.decoder,
                              evidence=cfg.evidence or bool(cfg.publish))
    else:
        result = replay_topics(cfg.bootstrap, th, cfg.limits())
    return deliver(result, cfg.output, cfg.publish, cfg.bootstrap, reference, cfg.evidence)


def _run_sql(cfg: ReplayConfig, reference: list[dict] | None) -> str:
    import clickhouse_connect  # loads chDB: only when it runs

    th = cfg.thresholds()
    client = connect(cfg.clickhouse, cfg.database, create=False) if cfg.clickhouse else \
        clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        source = archive_source(cfg.database) if cfg.clickhouse else file_source(list(cfg.inputs))
        if not cfg.evidence and not cfg.publish and reference is None:
            local = cfg.clickhouse is None or cfg.clickhouse.startswith("chdb:")
            return _lines_report(replay_sql_lines(client, source, th, cfg.output, local))
        signals, stats = replay_sql(client, source, th, cfg.limits(), evidence=cfg.evidence)
    finally:
        client.close()
    result = ReplayResult(signals, stats["events"], stats["seconds"], _outcomes(stats))
    return deliver(result, cfg.output, cfg.publish, cfg.bootstrap, reference, cfg.evidence)


def _outcomes(stats: dict) -> dict:
    return {"engine": "sql", "valid": stats["valid"], "sql_seconds": round(stats["sql_seconds"], 3)}


def _lines_report(stats: dict) -> str:
    """The report `report` prints, from the counts the SQL replay took."""
    counts = {kind: stats["counts"][kind] for kind in KINDS}
    return "\n".join(summary_lines(stats["events"], stats["seconds"], _outcomes(stats), counts))
