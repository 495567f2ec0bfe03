"""`coevolve replay --sweep`: every set of a grid in one pass equals `coevolve replay` with that set, over
Avro files, the archive and the topics; the report holds a table, JSON lines and a heatmap per kind."""
from __future__ import annotations

import json

import clickhouse_connect
import pytest
from typer.testing import CliRunner

from coevolve.services.archive.importer import import_files
from coevolve.services.cli import app
from coevolve.services.clickhouse.client import connect
from coevolve.services.simulate import SimulationConfig
from coevolve.streams.replay.command import run_replay
from coevolve.streams.replay.config import ReplayConfig
from coevolve.streams.replay.engine_python import replay_topics
from coevolve.streams.replay.sql_stages import file_source
from coevolve.streams.replay.sweep import parse_sweep, sweep_sql
from coevolve.streams.rules import KINDS, Thresholds
from tests.cli_output import plain
from tests.integration.test_sql_lines import python_lines, write_log
from tests.integration.test_sql_replay import publish_log, rough_log

pytestmark = pytest.mark.integration

GRID = ["streams.success_threshold=0.3,0.5,0.7", "streams.window=1,3,8", "streams.rare_threshold=2,10,40",
        "streams.pattern_length=1,2"]


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    trajectories, steps = rough_log(SimulationConfig(steps=30, tasks=16, batch_tasks=10, group_size=6), seed=13)
    return write_log(tmp_path_factory.mktemp("log") / "run.avro", trajectories, steps)


def _of_set(lines: list[bytes], th: Thresholds) -> bytes:
    tag = b'"thresholds":' + json.dumps(th.as_record(), separators=(",", ":")).encode() + b"}"
    return b"".join(line for line in lines if line.rstrip().endswith(tag))


def _counts(body: bytes) -> dict[str, int]:
    kinds = [json.loads(line)["type"] for line in body.splitlines()]
    return {k: kinds.count(k) for k in KINDS}


def test_every_set_of_a_grid_equals_the_python_replay_with_that_set(log, tmp_path):
    sweep = parse_sweep(GRID, Thresholds())
    client = clickhouse_connect.get_client(dsn="chdb://memory")
    try:
        results, stats = sweep_sql(client, file_source([log]), sweep, tmp_path / "sweep.jsonl")
    finally:
        client.close()
    assert stats["sets"] == len(results) == 54
    lines = (tmp_path / "sweep.jsonl").read_bytes().splitlines(keepends=True)
    assert sum(len(_of_set(lines, r.thresholds).splitlines()) for r in results) == len(lines)
    for r in results:
        expected = python_lines(log, r.thresholds)
        assert _of_set(lines, r.thresholds) == expected, r.thresholds
        assert r.counts == _counts(expected), r.thresholds
    seen = {k: {r.counts[k] for r in results} for k in KINDS}
    assert all(len(v) > 1 for v in seen.values()), f"every kind changes over the grid: {seen}"
    assert min(r.counts["forgetting"] for r in results) > 0 and min(r.counts["boundary"] for r in results) > 0


def test_the_archive_sweep_and_its_report_equal_per_set_replays(log, tmp_path):
    url = f"chdb://{tmp_path}/ch"
    client = connect(url)
    try:
        import_files(client, [log])
    finally:
        client.close()
    grid = ["success_threshold=0.3,0.7", "window=2,6", "rare_threshold=5,30"]
    text = run_replay(ReplayConfig(clickhouse=url, sweep=tuple(grid), output=tmp_path / "sweep.jsonl",
                                   report=tmp_path / "report"))
    assert "swept 8 threshold sets over 1802 trajectory events" in text  # the archive keeps each id once
    assert "fixed: n=1" in text
    lines = (tmp_path / "sweep.jsonl").read_bytes().splitlines(keepends=True)
    rows = [json.loads(line) for line in (tmp_path / "report" / "sweep.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    for row in rows:
        th = Thresholds(**row["thresholds"])
        run_replay(ReplayConfig(clickhouse=url, evidence=False, output=tmp_path / "one.jsonl", **row["thresholds"]))
        one = (tmp_path / "one.jsonl").read_bytes()
        assert _of_set(lines, th) == one and row["counts"] == _counts(one), th
    assert {p.name for p in (tmp_path / "report").iterdir()} == {
        "sweep.jsonl", "sweep.md", "sweep_forgetting.png", "sweep_boundary.png", "sweep_rare.png"}
    table = (tmp_path / "report" / "sweep.md").read_text().splitlines()
    assert table[2] == "| tau | W | theta | forgetting | boundary | rare | total |" and len(table) == 12


@pytest.mark.slow
def test_a_sweep_of_the_topics_equals_the_python_replay_of_the_topics(bootstrap, tmp_path):
    trajectories, steps = rough_log(SimulationConfig(steps=12, tasks=10, batch_tasks=6, group_size=4), seed=3)
    publish_log(bootstrap, trajectories, steps)
    run_replay(ReplayConfig(bootstrap=bootstrap, sweep=("success_threshold=0.4,0.6", "pattern_length=1,2"),
                            output=tmp_path / "sweep.jsonl"))
    lines = (tmp_path / "sweep.jsonl").read_bytes().splitlines(keepends=True)
    for tau, n in ((0.4, 1), (0.4, 2), (0.6, 1), (0.6, 2)):
        th = Thresholds(success_threshold=tau, pattern_length=n)
        expected = sorted(json.dumps(s.to_json(evidence=False), separators=(",", ":"))
                          for s in replay_topics(bootstrap, th).signals)
        assert sorted(line.decode().rstrip("\n") for line in lines if _of_set([line], th)) == expected
        assert len(expected) > 10


@pytest.mark.parametrize("spec, message", [
    ("streams.tau=0.5", "unknown field 'streams.tau'; sweep one of streams.success_threshold"),
    ("streams.window=", "give one or more comma-separated values"),
    ("streams.window=3,,5", "give one or more comma-separated values"),
    ("streams.window=0,5", "window (W) must be at least 1"),
    ("streams.rare_threshold=5,150", "rare_threshold (theta) is a percentage in [0, 100]"),
    ("streams.window=2.5", "'2.5' is not an integer"),
    ("streams.window", "write FIELD=V1,V2,..."),
])
def test_a_bad_sweep_spec_is_refused_with_its_reason(log, spec, message):
    result = CliRunner().invoke(app, ["replay", "--input", str(log), "--sweep", spec])
    assert result.exit_code == 2
    assert message in " ".join(plain(result.output).split())
