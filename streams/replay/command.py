"""The `coevolve replay` command: read a source, run an engine, hand the signals to the reports.

Python engine: Avro files (chDB or fastavro decoder) or the topics. SQL engine: the archive
(`--clickhouse URL`, for when the broker no longer holds the log) or Avro files read by embedded chDB.
Both write, publish, compare and report with the same functions (`report.py`), so their outputs compare
line for line. Without evidence, and with nothing to publish or compare, ClickHouse formats the output
lines itself (`sql_lines.py`), the fastest path.
"""
from __future__ import annotations

from pathlib import Path

from coevolve.services.clickhouse.client import connect
from coevolve.streams.replay.against import against_run, against_text, write_against_report
from coevolve.streams.replay.config import ReplayConfig
from coevolve.streams.replay.engine_python import replay_files, replay_topics
from coevolve.streams.replay.engine_sql import replay_sql
from coevolve.streams.replay.report import ReplayResult, deliver, load_reference, summary_lines
from coevolve.streams.replay.sql_lines import replay_sql_lines
from coevolve.streams.replay.sources import topic_files
from coevolve.streams.replay.sql_stages import archive_source, file_source
from coevolve.streams.replay.sweep import sweep_sql
from coevolve.streams.replay.sweep_report import sweep_table, write_sweep_report
from coevolve.streams.rules import KINDS


def run_replay(cfg: ReplayConfig) -> str:
    """Replay as `cfg` says; write or publish the signals; return the report."""
    if cfg.sweep:
        return _run_sweep(cfg)
    if cfg.against_run is not None:
        return _run_against(cfg)
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


def _run_sweep(cfg: ReplayConfig) -> str:
    """Every set of the sweep in one pass of the SQL engine; the topics are read once into Avro files."""
    import tempfile

    import clickhouse_connect

    sweep = cfg.swept()
    with tempfile.TemporaryDirectory(prefix="coevolve-sweep-") as tmp:
        inputs = topic_files(cfg.bootstrap, Path(tmp)) if cfg.bootstrap else list(cfg.inputs)
        client = connect(cfg.clickhouse, cfg.database, create=False) if cfg.clickhouse else \
            clickhouse_connect.get_client(dsn="chdb://memory")
        try:
            source = archive_source(cfg.database) if cfg.clickhouse else file_source(inputs)
            results, stats = sweep_sql(client, source, sweep, cfg.output, progress=True)
        finally:
            client.close()
    text = sweep_table(sweep, results, stats)
    if cfg.output is not None:
        text += f"\nsignals of every set: {cfg.output}"
    if cfg.report is not None:
        files = write_sweep_report(sweep, results, stats, cfg.report)
        text += f"\nreport: {', '.join(p.name for p in files)} in {cfg.report}"
    return text


def _run_against(cfg: ReplayConfig) -> str:
    """The run as it happened against one threshold set, with the lineage of what it would drop."""
    client = connect(cfg.clickhouse, cfg.database, create=False)
    try:
        result = against_run(client, cfg.database, cfg.against_run, cfg.thresholds)
    finally:
        client.close()
    text = against_text(result)
    if cfg.report is not None:
        files = write_against_report(result, cfg.report)
        text += f"\nreport: {', '.join(p.name for p in files)} in {cfg.report}"
    return text
