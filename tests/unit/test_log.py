"""Structured logs: one JSON object per line, written to the current stderr."""
import json
import logging

from coevolve.services.runtime import log as logs


def test_log_lines_are_json_with_event_and_fields(capsys):
    logs.configure("info")
    logs.get_logger("archiver").info("archiver.stored", events=12, tables={"steps": 1})
    logs.get_logger("archiver").debug("archiver.noise")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 1
    entry = lines[0]
    assert entry["event"] == "archiver.stored" and entry["service"] == "archiver"
    assert entry["events"] == 12 and entry["tables"] == {"steps": 1} and entry["level"] == "info"


def test_configure_twice_keeps_one_handler():
    logs.configure("warning")
    logs.configure("warning")
    handlers = [h for h in logging.getLogger("coevolve").handlers if getattr(h, "_coevolve", False)]
    assert len(handlers) == 1
