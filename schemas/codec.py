"""Avro single-object encoding: C3 01, 8-byte little-endian CRC-64-AVRO fingerprint, binary body.

Any consumer holding the .avsc files decodes any message without a registry server. Writer schemas
from older releases live in `history/`; a message written under one is resolved to the current
reader schema of the same record name by Avro's resolution rules.
"""
from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from coevolve.schemas.fingerprint import schema_fingerprint

MAGIC = b"\xc3\x01"
HEADER_SIZE = 10
SCHEMA_DIR = Path(__file__).resolve().parent
HISTORY_DIR = SCHEMA_DIR / "history"


class EncodeError(ValueError):
    """A record does not fit its schema."""


class DecodeError(ValueError):
    """A message could not be decoded; names where it came from."""

    error_type = "malformed"

    def __init__(self, reason: str, topic: str | None = None, partition: int | None = None,
                 offset: int | None = None):
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        where = f"{topic}[{partition}]@{offset}" if topic is not None else "<no topic>"
        super().__init__(f"{where}: {reason}")


class MalformedMessageError(DecodeError):
    """The bytes are not a valid single-object Avro message."""

    error_type = "malformed"


class UnknownSchemaError(DecodeError):
    """The message's writer fingerprint matches no schema in schemas/ or schemas/history/."""

    error_type = "unknown_schema"


@dataclass(frozen=True)
class WriterSchema:
    name: str
    fingerprint: int
    parsed: dict


def _full_name(schema: dict) -> str:
    ns = schema.get("namespace")
    return f"{ns}.{schema['name']}" if ns else schema["name"]


class SchemaRegistry:
    """The current schema of every event, plus every historical writer schema by fingerprint."""

    def __init__(self, directory: Path = SCHEMA_DIR, history: Path | None = HISTORY_DIR):
        self.current: dict[str, WriterSchema] = {}
        self.writers: dict[int, WriterSchema] = {}
        for path in sorted(directory.glob("*.avsc")):
            schema = self._register(path)
            if schema.name.rsplit(".", 1)[-1] != path.stem:
                raise ValueError(f"{path}: record is named {schema.name}; rename the file or the record")
            self.current[path.stem] = schema
        if history is not None and history.is_dir():
            for path in sorted(history.glob("*.avsc")):
                self._register(path)
        self._headers = {s.name.rsplit(".", 1)[-1]: MAGIC + struct.pack("<Q", s.fingerprint)
                         for s in self.current.values()}

    def _register(self, path: Path) -> WriterSchema:
        raw = json.loads(path.read_text())
        schema = WriterSchema(_full_name(raw), schema_fingerprint(raw), parse_schema(raw))
        self.writers.setdefault(schema.fingerprint, schema)
        return schema

    def fingerprint(self, record_name: str) -> int:
        return self.current[record_name].fingerprint

    def encode(self, record_name: str, record: dict, writer: int | None = None) -> bytes:
        """Encode `record` as the named event; `writer` picks a registered fingerprint instead."""
        if writer is None:
            try:
                schema, header = self.current[record_name], self._headers[record_name]
            except KeyError:
                raise EncodeError(f"no schema named {record_name!r}; known: {sorted(self.current)}") from None
        else:
            schema, header = self.writers[writer], MAGIC + struct.pack("<Q", writer)
        buf = io.BytesIO()
        buf.write(header)
        try:
            schemaless_writer(buf, schema.parsed, record)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
            raise EncodeError(f"{record_name}: record does not fit the schema: {exc!r}") from exc
        return buf.getvalue()

    def decode(self, data: bytes, topic: str | None = None, partition: int | None = None,
               offset: int | None = None) -> tuple[str, dict]:
        """Decode a message to (record name, record), resolved to the current schema of its name."""
        if data is None or len(data) < HEADER_SIZE or data[:2] != MAGIC:
            raise MalformedMessageError("not Avro single-object encoded (expected C3 01 and an 8-byte "
                                        "fingerprint)", topic, partition, offset)
        (fp,) = struct.unpack_from("<Q", data, 2)
        writer = self.writers.get(fp)
        if writer is None:
            raise UnknownSchemaError(f"unknown writer schema fingerprint {fp:016x}; add its .avsc to "
                                     "schemas/history/ to read it", topic, partition, offset)
        short = writer.name.rsplit(".", 1)[-1]
        reader = self.current.get(short)
        buf = io.BytesIO(data)
        buf.seek(HEADER_SIZE)
        try:
            if reader is None or reader.fingerprint == fp:
                record = schemaless_reader(buf, writer.parsed, None)
            else:
                record = schemaless_reader(buf, writer.parsed, reader.parsed)
        except Exception as exc:  # fastavro raises many types on bad bodies; all mean the same
            raise MalformedMessageError(f"{short} body does not decode: {exc!r}", topic, partition,
                                        offset) from exc
        if buf.tell() != len(data):
            raise MalformedMessageError(f"{short} body has {len(data) - buf.tell()} trailing bytes",
                                        topic, partition, offset)
        return short, record


_DEFAULT: SchemaRegistry | None = None


def default_registry() -> SchemaRegistry:
    """The registry of the installed schemas/ folder, built once per process."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = SchemaRegistry()
    return _DEFAULT
