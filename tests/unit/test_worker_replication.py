"""The signal worker's replication factor reaches Faust (its own topics, should it declare any)."""
import pytest

from coevolve.services.runtime.config import ConfigError, load
from coevolve.streams.worker.app import build_app
from coevolve.streams.worker.config import StreamsConfig
from coevolve.streams.worker.metrics import Metrics


def test_the_replication_factor_reaches_the_faust_app():
    cfg = load(StreamsConfig, "streams", environ={"STREAMS_REPLICATION_FACTOR": "3"})
    app = build_app(cfg, Metrics())
    assert app.conf.topic_replication_factor == 3
    assert app._leader_assignor._leader_topic.replicas == 3  # the one topic Faust sizes from the setting itself
    assert build_app(StreamsConfig(), Metrics()).conf.topic_replication_factor == 1


@pytest.mark.parametrize("value", [0, -1])
def test_a_replication_factor_below_one_is_refused(value):
    with pytest.raises(ConfigError, match="replication_factor"):
        StreamsConfig(replication_factor=value)
