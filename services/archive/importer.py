"""`coevolve archive import`: load Avro log files (as `coevolve simulate --output` writes them, or a
backup) into the archive, one SQL pass per file, idempotently.

chDB, in this process, reads the container files itself. A ClickHouse server cannot (the files are on
the client's disk, not the server's): the client decodes them and sends the rows as the archiver does
(`streamed`). Either way rows get the columns the archiver writes, with log_partition -1 and the record
index as offset. Importing a file again re-inserts the same rows,
which collapse into the stored ones by event_id (ReplacingMergeTree, read with FINAL), as the
archiver's redelivered batches do. `run_suffix` renames runs and event ids, to load one log as
several runs (benchmarks).

A file written under an older schema (schemas/history/) lacks the fields added since: those columns
take the current schema's defaults, as Avro resolution gives them to the archiver.
"""
from __future__ import annotations

from pathlib import Path

import fastavro

from coevolve.schemas import default_registry
from coevolve.schemas.container import LogFileError, log_paths, record_name
from coevolve.services.archive.rows import COLUMNS, ORIGIN, TABLE_OF, rows_for, schema_defaults
from coevolve.services.clickhouse.sql import literal, quote_path

# Columns that are not the event field of the same name: Avro enums as text, a trajectory's action names.
_EXPRESSIONS = {
    "TrajectoryRecorded": {"task_source": "toString(task_source)", "action_names": "actions.name"},
    "TaskChecked": {"source": "toString(source)", "verdict": "toString(verdict)"},
}
IMPORTABLE = ("TrajectoryRecorded", "StepCompleted", "ExplorationRecorded", "TaskChecked", "EvaluationCompleted")


def _default_sql(value) -> str:
    """An Avro field default as a ClickHouse literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return literal(value)
    if value == []:
        return "[]"
    raise ValueError(f"no SQL literal for the Avro default {value!r}")


def _defaults(name: str) -> dict[str, str]:
    """The current schema's field defaults, as SQL."""
    return {field: _default_sql(value) for field, value in schema_defaults(name).items()}


def _file_fields(path: Path) -> set[str]:
    with open(path, "rb") as fh:
        return {f["name"] for f in fastavro.reader(fh).writer_schema["fields"]}


def _select(name: str, fields: set[str], run: str, eid: str) -> tuple[list[str], list[str]]:
    """The table's columns and, per column, the expression reading it from a file with these fields."""
    columns = [c for c in COLUMNS[TABLE_OF[name]] if c not in ORIGIN]
    special = {"event_id": eid, "run_id": run, **_EXPRESSIONS.get(name, {})}
    defaults = _defaults(name)
    exprs = []
    for column in columns:
        if column in special:
            exprs.append(special[column])
        elif column in fields:
            exprs.append(column)
        elif column in defaults:
            exprs.append(defaults[column])
        else:
            raise LogFileError(f"{name} file lacks `{column}`, which has no default: not a {name} log")
    return columns, exprs


def _inserts(db: str, src: str, name: str, fields: set[str], run: str, eid: str) -> list[str]:
    """The INSERT ... SELECT statements that load a file of `name` events."""
    columns, exprs = _select(name, fields, run, eid)
    out = [f"""INSERT INTO {db}.{TABLE_OF[name]} ({', '.join(columns)}, log_partition, log_offset)
        SELECT {', '.join(exprs)}, -1, _row_number FROM {src}"""]
    if name == "TrajectoryRecorded":
        out.append(f"""INSERT INTO {db}.actions (event_id, run_id, step, task_id, position, name, arguments,
            observation, turn, score, log_partition, log_offset)
        SELECT {eid}, {run}, step, task_id, i - 1, a.name, a.arguments, a.observation, a.turn, score, -1,
               _row_number FROM {src} ARRAY JOIN actions AS a, arrayEnumerate(actions) AS i""")
    return out


def log_files(paths) -> list[Path]:
    """The given files and the other event files written beside a log's trajectory file, each once."""
    out: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise LogFileError(f"{path}: no such file")
        siblings = log_paths(path).values() if path.name.endswith(".avro") else ()
        for p in (path, *sorted(s for s in siblings if s.exists())):
            if p not in out:
                out.append(p)
    return out


def import_files(client, paths, database: str = "coevolve", run_suffix: str = "", streamed: bool = False
                 ) -> dict[str, int]:
    """Insert every event of the given log files (their sibling event files included); return the
    events read per record type. `streamed`: the client decodes the files and sends the rows (a server,
    which cannot read the client's files); else the engine reads them (chDB). Raise LogFileError for a
    file that is not an importable event log."""
    counts: dict[str, int] = {}
    suffix = literal(run_suffix)
    run, eid = f"concat(run_id, {suffix})", f"concat(event_id, {suffix})"
    files = [(path, record_name(path)) for path in log_files(paths)]
    for path, name in files:  # refuse before inserting anything
        if name not in IMPORTABLE:
            raise LogFileError(f"{path}: {name} files cannot be imported ({', '.join(IMPORTABLE)} can)")
    for path, name in files:
        if streamed:
            counts[name] = counts.get(name, 0) + _stream(client, database, path, name, run_suffix)
            continue
        src = f"file({quote_path(path)}, 'Avro')"
        for statement in _inserts(database, src, name, _file_fields(path), run, eid):
            client.command(statement)
        counts[name] = counts.get(name, 0) + int(client.query(f"SELECT count() FROM {src}").result_rows[0][0])
    return counts


def _stream(client, database: str, path: Path, name: str, run_suffix: str, batch: int = 5000) -> int:
    """Decode one file here (resolved to the current schema, so fields added since take their defaults) and
    insert its rows in batches; the events read."""
    rows: dict[str, list[list]] = {}
    count = 0

    def flush() -> None:
        for table, table_rows in rows.items():
            client.insert(f"{database}.{table}", [list(c) for c in zip(*table_rows)], column_names=COLUMNS[table],
                          column_oriented=True)
        rows.clear()

    current = default_registry().current[name].parsed
    with open(path, "rb") as fh:
        for index, event in enumerate(fastavro.reader(fh, reader_schema=current)):
            if run_suffix:
                event = {**event, "event_id": event["event_id"] + run_suffix, "run_id": event["run_id"] + run_suffix}
            for table, table_rows in rows_for(name, event, -1, index).items():
                rows.setdefault(table, []).extend(table_rows)
            count += 1
            if count % batch == 0:
                flush()
    flush()
    return count
