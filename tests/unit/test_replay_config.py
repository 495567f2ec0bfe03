"""`coevolve replay` takes the archive URL from the environment like every service's config (a Job
reads it from a Secret), but never lets it override a source named on the command line."""
import pytest

from coevolve.services.runtime.config import ConfigError
from coevolve.streams.replay.config import ReplayConfig

ENV = {"CLICKHOUSE_URL": "http://u:pw@ch:8123/", "REPLAY_CLICKHOUSE_URL": "http://u:pw@replay-ch:8123/"}


def test_the_service_key_comes_before_the_shared_one():
    assert ReplayConfig.of(ENV).clickhouse == ENV["REPLAY_CLICKHOUSE_URL"]
    cfg = ReplayConfig.of({"CLICKHOUSE_URL": ENV["CLICKHOUSE_URL"]}, window=3)
    assert cfg.clickhouse == ENV["CLICKHOUSE_URL"] and cfg.sql and cfg.window == 3


def test_the_flag_overrides_the_environment():
    assert ReplayConfig.of(ENV, clickhouse="chdb:///a/b").clickhouse == "chdb:///a/b"


@pytest.mark.parametrize("flags", [{"inputs": ("run.avro",)}, {"bootstrap": "kafka:9092"}])
def test_a_source_on_the_command_line_is_not_overridden(flags):
    cfg = ReplayConfig.of(ENV, **flags)
    assert cfg.clickhouse is None and not cfg.sql


def test_without_an_environment_or_a_source_it_says_what_to_give():
    with pytest.raises(ConfigError, match="CLICKHOUSE_URL"):
        ReplayConfig.of({"CLICKHOUSE_URL": ""})
    with pytest.raises(ConfigError, match="--clickhouse URL"):
        ReplayConfig.of()
