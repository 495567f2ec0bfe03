"""The signal worker creates the topics it needs with its configured replication factor."""
from __future__ import annotations

import pytest
from kafka.admin import KafkaAdminClient

from coevolve.services.kafka.topics import CATALOG
from coevolve.streams.worker.app import internal_topics
from coevolve.streams.worker.command import StreamsWorker
from coevolve.streams.worker.config import StreamsConfig

pytestmark = pytest.mark.integration


def test_the_worker_creates_its_topics_with_the_replication_factor(broker, tmp_path):
    cfg = StreamsConfig(kafka_bootstrap=broker.bootstrap, replication_factor=3, datadir=tmp_path / "faust")
    StreamsWorker(cfg).start()
    names = list(CATALOG) + [t.name for t in internal_topics(cfg.app_id).values()]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        described = admin.describe_topics(names)
    finally:
        admin.close()
    assert {d["name"] for d in described} == set(names)
    assert {len(p["replica_nodes"]) for d in described for p in d["partitions"]} == {3}
