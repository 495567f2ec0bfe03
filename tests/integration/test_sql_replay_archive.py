"""Through the broker into the archive: `coevolve replay --clickhouse` equals the Python replay of the topics."""
from __future__ import annotations

import uuid

import pytest

from coevolve.services.archive.archiver import Archiver
from coevolve.services.archive.config import ArchiverConfig
from coevolve.services.simulate import SimulationConfig
from coevolve.streams.replay.command import run_replay
from coevolve.streams.replay.config import ReplayConfig
from coevolve.streams.replay.engine_python import replay_topics
from coevolve.streams.replay.report import write_jsonl
from coevolve.streams.rules import Thresholds
from tests.integration.test_sql_replay import publish_log, rough_log

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_archive_replay_equals_topic_replay(bootstrap, tmp_path):
    trajectories, steps = rough_log(SimulationConfig(steps=30, tasks=24, batch_tasks=16, group_size=6), seed=5)
    publish_log(bootstrap, trajectories, steps)
    url = f"chdb://{tmp_path}/ch"
    Archiver(ArchiverConfig(kafka_bootstrap=bootstrap, clickhouse_url=url, idle_exit_seconds=1.5,
                            group_id=f"a-{uuid.uuid4().hex[:6]}")).run()
    for th in (Thresholds(), Thresholds(0.4, 2, 8.0, 2)):
        expected = replay_topics(bootstrap, th)
        assert expected.outcomes["late"] > 0 and expected.outcomes["duplicate"] > 0
        write_jsonl(expected.signals, tmp_path / "python.jsonl")
        text = run_replay(ReplayConfig(clickhouse=url, success_threshold=th.success_threshold, window=th.window,
                                       rare_threshold=th.rare_threshold, pattern_length=th.pattern_length,
                                       output=tmp_path / "sql.jsonl", compare=str(tmp_path / "python.jsonl")))
        assert f"compared with {len(expected.signals)} signals: +0 -0" in text
        python = sorted((tmp_path / "python.jsonl").read_text().splitlines())
        sql = sorted((tmp_path / "sql.jsonl").read_text().splitlines())
        assert sql == python and len(sql) > 100
