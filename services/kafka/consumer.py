"""Consume and decode Avro events; what cannot be decoded becomes a dead-letter event, never a crash."""
from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from kafka.errors import CommitFailedError, IllegalGenerationError, RebalanceInProgressError, UnknownMemberIdError

from coevolve.schemas import DecodeError, SchemaRegistry, default_registry
from coevolve.services.kafka.offsets import true_end_offsets
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.kafka.settings import FETCH_MAX_WAIT_MS, GROUP_TIMEOUTS_MS
from coevolve.services.kafka.topics import DEADLETTER
from coevolve.services.runtime.log import get_logger

log = get_logger("consumer")
# A commit the group no longer accepts: the member was rebalanced out, or a rebalance is under way. The
# partitions it kept are committed by its next commit; those it lost are read again by their new owner.
GROUP_MOVED = (CommitFailedError, RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError)


@dataclass(frozen=True)
class Delivered:
    """A decoded event and where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    name: str
    event: dict


def dead_letter_id(service: str, topic: str, partition: int | None, offset: int | None, error_type: str,
                   payload: bytes) -> str:
    """The same input rejected by the same service for the same reason always gets the same id, so a
    redelivered bad event is one dead letter downstream. The reason's free text (which may quote a
    model's answer) is not part of it; an input with no offset is identified by its bytes."""
    where = [partition, offset] if offset is not None else [hashlib.sha256(payload or b"").hexdigest()]
    text = "\x1f".join(map(str, ["deadletter", service, topic, *where, error_type]))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def dead_letter(topic: str, partition: int | None, offset: int | None, key: bytes | None,
                payload: bytes, error_type: str, reason: str, service: str) -> dict:
    """Build a DeadLettered event that keeps the original bytes whole."""
    return {
        "event_id": dead_letter_id(service, topic, partition, offset, error_type, payload), "source_topic": topic, "source_partition": partition,
        "source_offset": offset, "key": key, "payload": payload or b"", "error_type": error_type,
        "reason": reason, "service": service, "produced_at": int(time.time() * 1000),
    }


class ReadShort(RuntimeError):
    """A read that had to reach the partitions' ends (`read_to_end(complete=True)`) did not."""


class EventConsumer:
    """Poll topics, decode each message, and send undecodable ones to the dead-letter topic.

    With `group_id` it joins a consumer group (offsets committed by `commit()`); without, it reads
    every partition from the beginning (replay, tests). A new client's first metadata can still list
    no partitions, so the assignment waits up to `metadata_timeout_s` for every topic's partitions.

    A group member that does not poll for `max_poll_interval_ms` is put out of the group, and its next
    commit fails. Work longer than that (a model's) runs inside `working()`, which keeps polling.
    """

    def __init__(self, bootstrap: str, topics: list[str], group_id: str | None = None,
                 service: str = "consumer", registry: SchemaRegistry | None = None,
                 deadletters: EventProducer | None = None, from_beginning: bool = True,
                 metadata_timeout_s: float = 10.0, group_timeouts_ms: dict[str, int] | None = None,
                 security: KafkaSecurity | None = None):
        self.registry = registry or default_registry()
        self.service = service
        self.deadletters = deadletters
        self.dead_lettered = 0
        self.commits_failed = 0
        self._group = group_id is not None
        self._topics = list(topics)
        self._bootstrap = bootstrap
        common = dict(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      auto_offset_reset="earliest" if from_beginning else "latest",
                      client_id=f"coevolve-{service}", max_poll_records=5000,
                      fetch_max_bytes=64 * 1024 * 1024, fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
                      **(security or KafkaSecurity.from_environment()).kafka_python_options())
        if group_id is None:
            self._consumer = KafkaConsumer(**common)
            parts = self._partitions(topics, metadata_timeout_s)
            self._consumer.assign(parts)
            if from_beginning and parts:
                self._consumer.seek_to_beginning(*parts)
        else:
            timeouts = {**GROUP_TIMEOUTS_MS, **(group_timeouts_ms or {})}
            self._consumer = KafkaConsumer(*topics, group_id=group_id, **common, **timeouts)

    def _partitions(self, topics: list[str], timeout_s: float) -> list[TopicPartition]:
        """Every partition of `topics`, waiting for metadata that lists them; what is known at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            known = {t: self._consumer.partitions_for_topic(t) or set() for t in topics}
            if all(known.values()) or time.monotonic() > deadline:
                return [TopicPartition(t, p) for t in topics for p in sorted(known[t])]
            time.sleep(0.2)

    def poll(self, timeout_s: float = 1.0, max_records: int | None = None,
             records: list | None = None) -> list[Delivered]:
        """Return the next batch of decoded events (at most `max_records` messages); dead-letter the rest.
        With `records`, every message polled, decodable or not, is also appended to it as it came (a
        kafka-python `ConsumerRecord`: its bytes, key, headers and timestamp)."""
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out: list[Delivered] = []
        for messages in batches.values():
            if records is not None:
                records.extend(messages)
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

    @contextmanager
    def working(self, every_s: float = 1.0) -> Iterator[None]:
        """Keep the group membership through long work in the caller's thread.

        Raising `max_poll_interval_ms` to a model's pace would not do: the broker also holds every
        join for that long (it is the rebalance timeout), and Tansu holds it whole. So the assignment
        is paused and a thread polls every `every_s` seconds meanwhile. A partition that a rebalance
        hands over is polled once before it is paused: its position goes back to the first record that
        poll returned, so the next `poll()` delivers it and a `commit()` before then cannot pass it.
        The caller must not use the consumer inside.
        """
        if not self._group:
            yield
            return
        done = threading.Event()
        keeper = threading.Thread(target=self._keep_alive, args=(done, every_s), daemon=True,
                                  name=f"{self.service}-keep-alive")
        self._consumer.pause(*self._consumer.assignment())
        keeper.start()
        try:
            yield
        finally:
            done.set()
            keeper.join()
            self._consumer.resume(*self._consumer.paused())

    def _keep_alive(self, done: threading.Event, every_s: float) -> None:
        while not done.wait(every_s):
            try:
                # Not 0: a rebalance needs the poll to wait for the join and sync answers, or it rejoins forever.
                batches = self._consumer.poll(timeout_ms=int(every_s * 1000))
                for tp, records in batches.items():  # delivered by the next poll() instead
                    self._consumer.seek(tp, records[0].offset)
                self._consumer.pause(*self._consumer.assignment())  # partitions a rebalance just gave
            except Exception as exc:  # a broker hiccup must not end the work; the next poll reports it
                log.warning("consumer.keep_alive_failed", error=repr(exc))

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

    def read_to_end(self, timeout_s: float = 30.0, complete: bool = False) -> list[Delivered]:
        """Every event up to the partitions' ends as of now (a consumer without a group, e.g. a service
        loading a compacted catalog at start); what was read by `timeout_s`, with a warning, if short.
        With `complete`, a short read, or an end that could not be probed, raises `ReadShort` instead."""
        parts = sorted(self._consumer.assignment())
        reported = self._consumer.end_offsets(parts)
        unprobed: set = set()
        ends = true_end_offsets(self._bootstrap, {(tp.topic, tp.partition): reported[tp] for tp in parts},
                                unprobed=unprobed)
        out: list[Delivered] = []
        deadline = time.monotonic() + timeout_s
        behind = [tp for tp in parts if ends[(tp.topic, tp.partition)]]
        while behind and time.monotonic() < deadline:
            out += self.poll(0.2)
            behind = [tp for tp in behind if self._consumer.position(tp) < ends[(tp.topic, tp.partition)]]
        short = sorted({f"{tp.topic}:{tp.partition}" for tp in behind} | {f"{t}:{p}" for t, p in unprobed})
        unlisted = [t for t in self._topics if not any(tp.topic == t for tp in parts)]
        if unlisted and complete:  # a broker restarting, a missing Describe ACL, a topic not made yet
            raise ReadShort(f"{self.service} was given no partition of {', '.join(unlisted)}: the broker at "
                            f"{self._bootstrap} listed none within the metadata wait; check that the topic exists "
                            "and that this client may describe it, then start again")
        if short and complete:
            raise ReadShort(f"{self.service} read {', '.join(short)} short of the end within {timeout_s:.0f} s "
                            f"(or its end could not be probed); check the broker at {self._bootstrap}, then "
                            "start again (a longer read needs a larger timeout)")
        if behind:
            log.warning("consumer.read_to_end_short", service=self.service, timeout_s=timeout_s,
                        partitions=[f"{tp.topic}:{tp.partition}" for tp in behind])
        return out

    def commit(self, below: Mapping[tuple[str, int], int] | None = None) -> bool:
        """Commit the offsets of everything polled so far (call after the batch is stored), or on the
        partitions `below` names only up to that offset (a record still held, `holds.py`); False when
        the group moved on (a rebalance): nothing to fix, the service goes on polling, and what was not
        committed comes again, which idempotent handling absorbs."""
        if self.deadletters is not None:
            self.deadletters.flush()
        try:
            if below:
                positions = {tp: self._consumer.position(tp) for tp in self._consumer.assignment()}
                self._consumer.commit({tp: OffsetAndMetadata(min(below.get((tp.topic, tp.partition), at), at), "", -1)
                                       for tp, at in positions.items() if at is not None})
            else:
                self._consumer.commit()
        except GROUP_MOVED as exc:
            self.commits_failed += 1
            log.warning("consumer.commit_failed", service=self.service, error=type(exc).__name__,
                        detail=str(exc)[:300], then="polling on; uncommitted events are delivered again")
            return False
        return True

    def close(self) -> None:
        self._consumer.close(autocommit=False)
