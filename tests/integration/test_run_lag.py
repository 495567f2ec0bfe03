"""Drain detection: a group's lag against the true end offsets of its topics, on the real broker."""
import time

import pytest

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import STEPS, TASKS, create_topics
from coevolve.services.run.lag import LagProbe
from tests.events import sample_events

pytestmark = pytest.mark.integration


def test_lag_counts_what_a_group_has_not_committed_and_drops_to_zero_after_its_commit():
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        producer = EventProducer(broker.bootstrap)
        for _ in range(5):
            producer.send(STEPS.name, sample_events()["StepCompleted"], key="r1")
        producer.flush()
        probe = LagProbe(broker.bootstrap)
        consumer = EventConsumer(broker.bootstrap, [STEPS.name], group_id="g1")
        try:
            assert probe.behind({"a": ("g1", [STEPS.name]), "b": ("g2", [STEPS.name, TASKS.name])}) == \
                {"a": 5, "b": 5}
            got, deadline = [], time.monotonic() + 30
            while len(got) < 5 and time.monotonic() < deadline:
                got += consumer.poll(0.5)
            consumer.commit()
            assert probe.lag("g1", [STEPS.name]) == 0
            producer.send(STEPS.name, sample_events()["StepCompleted"], key="r1")
            producer.flush()
            assert probe.lag("g1", [STEPS.name]) == 1 and probe.lag("g2", [STEPS.name]) == 6
        finally:
            consumer.close()
            probe.close()
            producer.close()
