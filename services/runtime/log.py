"""Structured logs: one JSON object per line on stderr (or a file), `event` plus key-value fields."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                 "service": record.name.removeprefix("coevolve."), "event": record.getMessage()}
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _StderrHandler(logging.StreamHandler):
    """Write to whatever sys.stderr is at the time of the record, not at configuration time."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class StructuredLogger:
    """`log.info("event.name", key=value)`: the event name is stable, fields are data."""

    def __init__(self, name: str):
        self._logger = logging.getLogger(f"coevolve.{name}")

    def _log(self, level: int, event: str, exc_info: bool = False, **fields) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": fields}, exc_info=exc_info)

    def debug(self, event: str, **fields) -> None:
        self._log(logging.DEBUG, event, **fields)

    def info(self, event: str, **fields) -> None:
        self._log(logging.INFO, event, **fields)

    def warning(self, event: str, **fields) -> None:
        self._log(logging.WARNING, event, **fields)

    def error(self, event: str, exc_info: bool = False, **fields) -> None:
        self._log(logging.ERROR, event, exc_info=exc_info, **fields)


def configure(level: str = "info") -> None:
    """Send coevolve's logs to stderr as JSON lines at `level` (the CLI's --log-level)."""
    root = logging.getLogger("coevolve")
    root.setLevel(level.upper())
    if any(getattr(h, "_coevolve", False) for h in root.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(_JsonFormatter())
    handler._coevolve = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.propagate = False
    logging.Formatter.converter = time.gmtime


def to_file(path: Path) -> None:
    """Send coevolve's logs to `path` (JSON lines, appended) instead of stderr: a terminal for people."""
    root = logging.getLogger("coevolve")
    for handler in [h for h in root.handlers if getattr(h, "_coevolve", False)]:
        root.removeHandler(handler)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_JsonFormatter())
    handler._coevolve = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.propagate = False


def get_logger(name: str) -> StructuredLogger:
    return StructuredLogger(name)
