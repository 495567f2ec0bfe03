"""`coevolve replay` over Avro files: the same signals with every decoder (chDB, fastavro in one or two
processes), JSON lines, diffs."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coevolve.schemas.container import LogWriter, read_log
from coevolve.services.cli import app
from coevolve.services.simulate import SimulationConfig, write_file
from coevolve.streams.replay import engine_python as replay
from coevolve.streams.replay import sources
from coevolve.streams.replay.engine_python import replay_signals
from coevolve.streams.rules import Thresholds


pytestmark = pytest.mark.integration

def _log(tmp_path, steps=6):
    write_file(SimulationConfig(steps=steps, seed=3), tmp_path / "run.avro")
    return tmp_path / "run.avro"


def test_files_match_pure_replay_with_chdb_or_one_or_two_fastavro_decoders(tmp_path, monkeypatch):
    path = _log(tmp_path)
    files = sources.expand_inputs([path])
    assert [f.name for f in files] == ["run.avro", "run.StepCompleted.avro"]
    expected = {s.id: s.to_json() for s in replay_signals(read_log(files))}
    assert expected
    monkeypatch.setattr(sources, "CHUNK_BYTES", 50_000)  # several chunks, so two workers share them
    for decoder, workers in (("chdb", 1), ("fastavro", 1), ("fastavro", 2)):
        result = replay.replay_files([path], workers=workers, decoder=decoder)
        assert {s.id: s.to_json() for s in result.signals} == expected, decoder
        assert result.events == 6 * 16 * 8


def test_without_evidence_the_same_signals_carry_no_trajectories(tmp_path):
    path = _log(tmp_path)
    full = replay.replay_files([path])
    bare = replay.replay_files([path], evidence=False)
    assert [s.to_json(evidence=False) for s in bare.signals] == [s.to_json(evidence=False) for s in full.signals]
    assert any(s.evidence.get("trajectories") for s in full.signals)
    assert not any(s.evidence.get("trajectories") for s in bare.signals)
    assert [s.evidence.get("scores") for s in bare.signals] == [s.evidence.get("scores") for s in full.signals]


def test_log_without_step_records_is_valid(tmp_path):
    path = _log(tmp_path, steps=3)
    only = tmp_path / "only.avro"
    with LogWriter(only) as w:
        for name, event in read_log([path]):
            w.write(name, event)
    result = replay.replay_files([only])
    kinds = {s.kind for s in result.signals}
    assert "rare" in kinds and "boundary" in kinds
    assert all(s.incomplete for s in result.signals if s.kind == "rare")


def test_cli_writes_json_lines_and_diffs(tmp_path):
    path = _log(tmp_path)
    runner = CliRunner()
    base, wide = tmp_path / "base.jsonl", tmp_path / "w1.jsonl"
    res = runner.invoke(app, ["replay", "--input", str(path), "--output", str(base)])
    assert res.exit_code == 0, res.output
    assert "signals: forgetting=" in res.output
    lines = [json.loads(line) for line in base.read_text().splitlines()]
    assert lines and {"type", "step", "run_id", "id", "pattern", "task_id"} <= set(lines[0])
    for s in lines:
        assert (s["task_id"] is not None) == (s["type"] in ("forgetting", "boundary"))
        assert isinstance(s["pattern"], list) and (len(s["pattern"]) == 1) == (s["type"] == "rare")
    res = runner.invoke(app, ["replay", "--input", str(path), "--output", str(wide), "--rare-threshold", "2",
                              "--window", "1", "--success-threshold", "0.6", "--pattern-length", "2",
                              "--compare", str(base)])
    assert res.exit_code == 0, res.output
    new = [json.loads(line) for line in wide.read_text().splitlines()]
    assert all(len(s["pattern"]) == 2 for s in new if s["type"] == "rare")
    assert new[0]["thresholds"] == Thresholds(0.6, 1, 2.0, 2).as_record()
    removed = {(s["type"], s["step"], s["subject"]) for s in lines} - {(s["type"], s["step"], s["subject"]) for s in new}
    assert f"compared with {len(lines)} signals:" in res.output
    assert f"-{len(removed)}" in res.output


def test_cli_needs_a_source():
    res = CliRunner().invoke(app, ["replay"])
    assert res.exit_code != 0
