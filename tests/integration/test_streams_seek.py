"""After a rebalance a worker resumes each source partition from its committed offset, and one that was
never committed from its first offset (`faust_compat.resume_in_order`), on the real broker and
aiokafka's own seek: it leaves a partition with no committed offset wherever a fetch left it."""
from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import Topic, create_topics
from coevolve.streams.worker.faust_compat import resume_in_order

pytestmark = pytest.mark.integration
MESSAGES = 5


async def fetch_all(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
    """Fetch until every partition's position is past its messages, as a consumer does while Faust's
    table recovery drops what it fetches."""
    for _ in range(100):
        positions = [await consumer.position(tp) for tp in tps]
        if positions == [MESSAGES] * len(tps):
            return
        await consumer.getmany(*tps, timeout_ms=200)
    raise AssertionError(f"positions {positions}, wanted {MESSAGES} each")


async def seek_wait(consumer: AIOKafkaConsumer, targets: dict) -> None:
    """Faust's seek_wait on its aiokafka consumer: seek each partition, then wait for the positions."""
    for tp, offset in targets.items():
        consumer.seek(tp, offset)
    await asyncio.gather(*(consumer.position(tp) for tp in targets))


async def positions_after_the_seek(bootstrap: str, names: dict[str, str]) -> tuple[dict, dict]:
    tps = {role: TopicPartition(name, 0) for role, name in names.items()}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(list(tps.values()))
        await consumer.commit({tps["committed"]: OffsetAndMetadata(2, "")})
        await fetch_all(consumer, list(tps.values()))
        await consumer.seek_to_committed()
        plain = {role: await consumer.position(tp) for role, tp in tps.items()}
        await fetch_all(consumer, list(tps.values()))
        app = SimpleNamespace(
            on_rebalance_start=lambda: None, tables=SimpleNamespace(changelog_topics={names["changelog"]}),
            consumer=SimpleNamespace(seek_to_committed=consumer.seek_to_committed, getmany=None,
                                     earliest_offsets=lambda *tps: consumer.beginning_offsets(tps),
                                     seek_wait=lambda targets: seek_wait(consumer, targets)))
        resume_in_order(app)
        await app.consumer.seek_to_committed()
        return plain, {role: await consumer.position(tp) for role, tp in tps.items()}
    finally:
        await consumer.stop()


def test_a_partition_never_committed_resumes_from_its_first_offset(bootstrap):
    suffix = uuid.uuid4().hex[:8]
    names = {"uncommitted": f"source-{suffix}", "committed": f"committed-{suffix}",
             "changelog": f"app-table-changelog-{suffix}"}
    create_topics(bootstrap, [Topic(name, "x", "x", 1) for name in names.values()])
    with EventProducer(bootstrap, client_id="test") as producer:
        for name in names.values():
            for i in range(MESSAGES):
                producer.send_raw(name, b"m%d" % i, "k", "raw")
    plain, fixed = asyncio.run(positions_after_the_seek(bootstrap, names))
    # aiokafka alone: the uncommitted partition stays where the fetch left it, past every message
    assert plain == {"uncommitted": MESSAGES, "committed": 2, "changelog": MESSAGES}
    # with the fix it starts again from its first offset; table recovery positions changelogs itself
    assert fixed == {"uncommitted": 0, "committed": 2, "changelog": MESSAGES}
