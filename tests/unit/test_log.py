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


def test_logs_can_go_to_a_file_instead_of_stderr(tmp_path, capsys):
    from coevolve.services.runtime.log import configure, get_logger, to_file

    configure("info")
    to_file(tmp_path / "logs" / "run.log")
    try:
        get_logger("run").info("run.started", steps=3)
        line = json.loads((tmp_path / "logs" / "run.log").read_text().splitlines()[-1])
        assert line["event"] == "run.started" and line["steps"] == 3
        assert "run.started" not in capsys.readouterr().err
    finally:  # back to stderr for the tests after this one
        root = logging.getLogger("coevolve")
        for handler in [h for h in root.handlers if getattr(h, "_coevolve", False)]:
            root.removeHandler(handler)
            handler.close()
        configure("info")
