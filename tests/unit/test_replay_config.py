"""`coevolve replay` takes the archive URL from the environment like every service's config (a Job
reads it from a Secret), but never lets it override a source named on the command line."""
import re

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


def test_a_sweep_is_the_product_of_its_fields_over_the_other_thresholds():
    cfg = ReplayConfig(inputs=("run.avro",), window=7, sweep=("streams.success_threshold=0.3,0.5", "rare_threshold=2,10,40"))
    sets = cfg.swept().sets()
    assert [(s.success_threshold, s.rare_threshold) for s in sets] == \
        [(0.3, 2.0), (0.3, 10.0), (0.3, 40.0), (0.5, 2.0), (0.5, 10.0), (0.5, 40.0)]
    assert {s.window for s in sets} == {7} and {s.pattern_length for s in sets} == {1}


@pytest.mark.parametrize("flags, message", [
    ({"sweep": ("window=3", "streams.window=5")}, "streams.window is given twice"),
    ({"sweep": ("window=3,3",)}, "a value is listed twice"),
    ({"sweep": ("window=3",), "compare": "old.jsonl"}, "drop --publish and --compare"),
    ({"sweep": ("window=3",), "clickhouse": "chdb:///a", "bootstrap": "kafka:9092"}, "--sweep reads one source"),
    ({"against_run": "r1"}, "--against-run reads the run's lineage from the archive"),
    ({"against_run": "r1", "clickhouse": "chdb:///a", "sweep": ("window=3,5",)}, "takes one threshold set"),
    ({"against_run": " ", "clickhouse": "chdb:///a"}, "give a run id"),
])
def test_a_sweep_or_run_comparison_it_cannot_do_says_why(flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        ReplayConfig(**{"inputs": ("run.avro",), **flags} if "clickhouse" not in flags else flags)
