"""Consume and decode Avro events; what cannot be decoded becomes a dead-letter event, never a crash."""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition

from coevolve.schemas import DecodeError, SchemaRegistry, default_registry
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.settings import FETCH_MAX_WAIT_MS, GROUP_TIMEOUTS_MS
from coevolve.services.kafka.topics import DEADLETTER
from coevolve.services.runtime.log import get_logger

log = get_logger("consumer")


@dataclass(frozen=True)
class Delivered:
    """A decoded event and where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    name: str
    event: dict


def dead_letter(topic: str, partition: int | None, offset: int | None, key: bytes | None,
                payload: bytes, error_type: str, reason: str, service: str) -> dict:
    """Build a DeadLettered event that keeps the original bytes whole."""
    return {
        "event_id": str(uuid.uuid4()), "source_topic": topic, "source_partition": partition,
        "source_offset": offset, "key": key, "payload": payload or b"", "error_type": error_type,
        "reason": reason, "service": service, "produced_at": int(time.time() * 1000),
    }


class EventConsumer:
    """Poll topics, decode each message, and send undecodable ones to the dead-letter topic.

    With `group_id` it joins a consumer group (offsets committed by `commit()`); without, it reads
    every partition from the beginning (replay, tests). A new client's first metadata can still list
    no partitions, so the assignment waits up to `metadata_timeout_s` for every topic's partitions.
    """

    def __init__(self, bootstrap: str, topics: list[str], group_id: str | None = None,
                 service: str = "consumer", registry: SchemaRegistry | None = None,
                 deadletters: EventProducer | None = None, from_beginning: bool = True,
                 metadata_timeout_s: float = 10.0):
        self.registry = registry or default_registry()
        self.service = service
        self.deadletters = deadletters
        self.dead_lettered = 0
        common = dict(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest" if from_beginning else "latest",
                      client_id=f"coevolve-{service}", max_poll_records=5000,
                      fetch_max_bytes=64 * 1024 * 1024, fetch_max_wait_ms=FETCH_MAX_WAIT_MS)
        if group_id is None:
            self._consumer = KafkaConsumer(**common)
            parts = self._partitions(topics, metadata_timeout_s)
            self._consumer.assign(parts)
            if from_beginning and parts:
                self._consumer.seek_to_beginning(*parts)
        else:
            self._consumer = KafkaConsumer(*topics, group_id=group_id, **common, **GROUP_TIMEOUTS_MS)

    def _partitions(self, topics: list[str], timeout_s: float) -> list[TopicPartition]:
        """Every partition of `topics`, waiting for metadata that lists them; what is known at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            known = {t: self._consumer.partitions_for_topic(t) or set() for t in topics}
            if all(known.values()) or time.monotonic() > deadline:
                return [TopicPartition(t, p) for t in topics for p in sorted(known[t])]
            time.sleep(0.2)

    def poll(self, timeout_s: float = 1.0) -> list[Delivered]:
        """Return the next batch of decoded events; dead-letter the rest."""
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        out: list[Delivered] = []
        for tp, messages in batches.items():
            for msg in messages:
                try:
                    name, event = self.registry.decode(msg.value, msg.topic, msg.partition, msg.offset)
                except DecodeError as err:
                    self._dead_letter(msg.topic, msg.partition, msg.offset, msg.key, msg.value,
                                      err.error_type, str(err))
                    continue
                out.append(Delivered(msg.topic, msg.partition, msg.offset, msg.key, name, event))
        return out

    def _dead_letter(self, topic, partition, offset, key, payload, error_type, reason) -> None:
        self.dead_lettered += 1
        log.warning("consumer.dead_letter", topic=topic, partition=partition, offset=offset,
                    error_type=error_type, reason=reason)
        if self.deadletters is not None:
            record = dead_letter(topic, partition, offset, key, payload, error_type, reason, self.service)
            self.deadletters.send(DEADLETTER.name, record, key=topic)

    def reject(self, item: Delivered, error_type: str, reason: str) -> None:
        """Dead-letter a decoded event that is invalid for this consumer (e.g. late)."""
        payload = self.registry.encode(item.name, item.event)
        self._dead_letter(item.topic, item.partition, item.offset, item.key, payload, error_type, reason)

    def assigned(self) -> bool:
        """Whether this consumer holds any partition (a group member may hold none)."""
        return bool(self._consumer.assignment())

    def __iter__(self) -> Iterator[Delivered]:
        while True:
            yield from self.poll()

    def drain(self, idle_s: float = 2.0, limit: int | None = None) -> list[Delivered]:
        """Read until nothing arrives for `idle_s` seconds (or `limit` events)."""
        out: list[Delivered] = []
        last = time.monotonic()
        while time.monotonic() - last < idle_s and (limit is None or len(out) < limit):
            batch = self.poll(0.2)
            if batch:
                out += batch
                last = time.monotonic()
        return out

    def commit(self) -> None:
        """Commit the offsets of everything polled so far (call after the batch is stored)."""
        if self.deadletters is not None:
            self.deadletters.flush()
        self._consumer.commit()

    def close(self) -> None:
        self._consumer.close(autocommit=False)
