"""Event logs as Avro object container files: one file per event type, root schema = the event record.

One record type per file keeps every file readable by ClickHouse's `file(..., 'Avro')`, whose root
schema must be a record. `write_log("run.avro", events)` writes the trajectories to run.avro and the
other events beside it (run.StepCompleted.avro, ...); `read_log` reads any of them back.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import fastavro

from coevolve.schemas.codec import SCHEMA_DIR

PRIMARY = "TrajectoryRecorded"


class LogFileError(ValueError):
    """A file is not an Avro container of a known event."""


def log_paths(path: Path | str) -> dict[str, Path]:
    """The file each event type goes to for a log written at `path`."""
    path = Path(path)
    stem = path.name[: -len(".avro")] if path.name.endswith(".avro") else path.name
    names = [p.stem for p in sorted(SCHEMA_DIR.glob("*.avsc"))]
    return {n: path if n == PRIMARY else path.with_name(f"{stem}.{n}.avro") for n in names}


class LogWriter:
    """Append events to per-type container files; files are created on first use."""

    def __init__(self, path: Path | str, codec: str = "null", block_records: int = 4096):
        self.paths = log_paths(path)
        self.codec = codec
        self.block_records = block_records
        self._buffers: dict[str, list[dict]] = {}
        self._schemas: dict[str, dict] = {}
        self._started: set[str] = set()
        self.counts: dict[str, int] = {}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        for target in set(self.paths.values()):
            if target.exists():
                target.unlink()

    def write(self, name: str, event: dict) -> None:
        buf = self._buffers.setdefault(name, [])
        buf.append(event)
        self.counts[name] = self.counts.get(name, 0) + 1
        if len(buf) >= self.block_records:
            self._flush(name)

    def _flush(self, name: str) -> None:
        buf = self._buffers.get(name)
        if not buf:
            return
        schema = self._schemas.get(name)
        if schema is None:
            schema = self._schemas[name] = fastavro.parse_schema(json.loads((SCHEMA_DIR / f"{name}.avsc").read_text()))
        path = self.paths[name]
        mode = "a+b" if name in self._started else "wb"
        with open(path, mode) as fh:
            fastavro.writer(fh, schema, buf, codec=self.codec)
        self._started.add(name)
        buf.clear()

    def close(self) -> list[Path]:
        """Flush everything; return the files written."""
        for name in list(self._buffers):
            self._flush(name)
        return [self.paths[n] for n in sorted(self._started)]

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_log(paths: Iterable[Path | str]) -> Iterator[tuple[str, dict]]:
    """Yield (record name, event) from each container file in turn."""
    for path in paths:
        try:
            fh = open(path, "rb")
        except OSError as exc:
            raise LogFileError(f"{path}: cannot open: {exc.strerror}") from exc
        with fh:
            try:
                reader = fastavro.reader(fh)
            except (ValueError, EOFError) as exc:
                raise LogFileError(f"{path}: not an Avro container file ({exc})") from exc
            root = reader.writer_schema
            if not isinstance(root, dict) or root.get("type") != "record":
                raise LogFileError(f"{path}: root schema must be one event record, one type per file")
            name = root["name"].rsplit(".", 1)[-1]
            for event in reader:
                yield name, event


def record_name(path: Path | str) -> str:
    """The event record a log file holds (its root schema's name); raise LogFileError."""
    try:
        with open(path, "rb") as fh:
            reader = fastavro.reader(fh)
            root = reader.writer_schema
    except OSError as exc:
        raise LogFileError(f"{path}: cannot open: {exc.strerror}") from exc
    except (ValueError, EOFError) as exc:
        raise LogFileError(f"{path}: not an Avro container file ({exc})") from exc
    if not isinstance(root, dict) or root.get("type") != "record":
        raise LogFileError(f"{path}: root schema must be one event record, one type per file")
    return root["name"].rsplit(".", 1)[-1]
