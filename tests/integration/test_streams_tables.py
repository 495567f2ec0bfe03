"""A worker's table writes are stored on the broker before the batch that made them is acknowledged
(`faust_compat.confirm_writes`): Faust's own flush before a commit gives up after 0.1 s without a send,
and a worker killed after such a commit lost the table writes of events it would not read again."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from types import SimpleNamespace

import pytest
from kafka import KafkaConsumer, TopicPartition

from coevolve.services.kafka.topics import Topic, create_topics
from coevolve.streams.worker.app import PARTITIONS, build_app, internal_topics
from coevolve.streams.worker.config import StreamsConfig
from coevolve.streams.worker.faust_compat import ConfirmedTable, confirm_writes, write_under
from coevolve.streams.worker.metrics import Metrics

pytestmark = pytest.mark.integration


class CountsEvent:
    """What a table write needs of the event it is made under: its topic and partition."""

    def __init__(self, topic: str, partition: int):
        self.message = SimpleNamespace(topic=topic, partition=partition)


def stored(consumer: KafkaConsumer, tp: TopicPartition, wait_s: float) -> dict[str, dict]:
    """The records of `tp` from its beginning, read for `wait_s` at most (blocking the event loop)."""
    consumer.seek_to_beginning(tp)
    out, deadline = {}, time.monotonic() + wait_s
    while time.monotonic() < deadline and len(out) < 3:
        for records in consumer.poll(200).values():
            out.update({json.loads(r.key): json.loads(r.value) for r in records})
    return out


async def write_then_confirm(cfg: StreamsConfig, consumer: KafkaConsumer, tp: TopicPartition) -> tuple:
    app = build_app(cfg, Metrics())  # in the running loop, as the worker builds it
    await app.producer.start()
    await app.producer.buffer.maybe_start()
    try:
        table = app.tables["step_to_counts"]
        event = CountsEvent(internal_topics(app.conf.id)["counts"].name, tp.partition)
        write_under(table, {f"run\x1f{step}": (event, {"step": step}) for step in range(3)})
        before = stored(consumer, tp, 1.0)  # the records wait in Faust's buffer: nothing has sent them yet
        await confirm_writes(table)
        return before, stored(consumer, tp, 0.5), table.unconfirmed
    finally:
        await app.producer.stop()


def test_confirm_writes_returns_once_the_changelog_records_are_stored(bootstrap, tmp_path):
    cfg = StreamsConfig(kafka_bootstrap=bootstrap, app_id=f"t-{uuid.uuid4().hex[:8]}", datadir=tmp_path)
    app = build_app(cfg, Metrics())
    assert {type(t) for t in app.tables.values()} == {ConfirmedTable}
    changelog = TopicPartition(app.tables["step_to_counts"].changelog_topic.get_topic_name(), 2)
    create_topics(bootstrap, [Topic(changelog.topic, "json", "table key", PARTITIONS)])
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    consumer.assign([changelog])
    try:
        before, after, unconfirmed = asyncio.run(asyncio.wait_for(write_then_confirm(cfg, consumer, changelog), 60))
    finally:
        consumer.close()
    assert before == {}
    assert after == {f"run\x1f{step}": {"step": step} for step in range(3)}  # stored when confirm_writes returned
    assert unconfirmed == []
