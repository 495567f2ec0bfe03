"""Put a log kept in the archive (`archiver.log_id`) back on an empty broker.

Every partition's records are sent again in offset order, one request in flight, so on an empty
partition each lands at the offset it had: the restore checks each one and stops at the first that
does not (a partition kept with a hole cannot be put back at its offsets, and is refused before
anything is sent). Keys, headers and timestamps are the ones sent; a compacted topic comes back whole,
every version of each key, as its log was before compaction.

Then the consumer groups' last recorded positions (`positions.py`), each at most its partition's
restored end. A group that also reads topics the archive does not keep (the signal worker's own topics
and table changelogs) is not given positions: its state did not survive the broker, so it reads the
restored topics from the start and rebuilds it (the worker then raises only the signals not already on
the log). The archiver's group is placed at the ends: it stored everything restored.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from tqdm import tqdm

from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.kafka.topics import CATALOG, create_topics
from coevolve.services.runtime.log import get_logger

log = get_logger("archive")
CHUNK = 20000  # records read from the archive per query


class RestoreError(RuntimeError):
    """The log cannot be put back: not kept, kept with a hole, or the broker's topics are not empty."""


class NoSuchLog(RestoreError):
    """The archive keeps no log of that name."""


@dataclass
class Restored:
    """What a restore put back."""

    log_id: str
    records: dict[str, int] = field(default_factory=dict)  # topic -> records
    groups: dict[str, int] = field(default_factory=dict)  # group -> partitions positioned
    started_over: list[str] = field(default_factory=list)  # groups left to read from the start
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.records.values())

    def line(self) -> str:
        over = f"; from the start: {', '.join(self.started_over)}" if self.started_over else ""
        return (f"restored log {self.log_id}: {self.total} records on {len(self.records)} topics, positions of "
                f"{len(self.groups)} consumer groups{over} ({self.seconds:.1f} s)")


def kept_logs(client, database: str) -> list[str]:
    return [r[0] for r in client.query(f"SELECT DISTINCT log_id FROM {database}.log ORDER BY log_id").result_rows]


def kept_partitions(client, database: str, log_id: str) -> dict[tuple[str, int], int]:
    """(topic, partition) -> records kept; RestoreError when there are none or a partition has a hole."""
    rows = client.query(f"SELECT topic, partition, count(), min(offset), max(offset) FROM {database}.log FINAL "
                        "WHERE log_id = {log_id:String} GROUP BY topic, partition ORDER BY topic, partition",
                        parameters={"log_id": log_id}).result_rows
    if not rows:
        kept = ", ".join(kept_logs(client, database)) or "none"
        raise NoSuchLog(f"the archive keeps no log named {log_id!r} (kept: {kept}); a log is kept by an archiver "
                        "run with archiver.log_id set")
    holes = [f"{t}:{p} ({n} records, offsets {lo}..{hi})" for t, p, n, lo, hi in rows if lo != 0 or hi != n - 1]
    if holes:
        raise RestoreError(f"log {log_id} is kept with holes in {', '.join(holes)}: its records cannot land at their "
                           "offsets again; read it with `coevolve replay --clickhouse` instead")
    return {(t, p): n for t, p, n, _, _ in rows}


def restore_log(client, database: str, log_id: str, bootstrap: str, archiver_group: str | None = None,
                start_over: Iterable[str] = (), security: KafkaSecurity | None = None) -> Restored:
    """Send every kept record of `log_id` to the broker at `bootstrap`, at its offset, then set the groups'
    positions (not those of `start_over`, nor of a group that read topics the log does not keep); raise
    RestoreError when the log cannot be put back or the topics already hold records."""
    started = time.monotonic()
    security = security or KafkaSecurity.from_environment()
    kept = kept_partitions(client, database, log_id)
    unknown = sorted({t for t, _ in kept} - set(CATALOG))
    if unknown:
        raise RestoreError(f"log {log_id} keeps topics outside the catalog: {unknown}")
    create_topics(bootstrap, security=security)
    _require_empty(bootstrap, kept, security)
    done = Restored(log_id)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_in_flight_requests_per_connection=1,
                             linger_ms=5, batch_size=1 << 20, max_request_size=64 << 20, retries=5,
                             client_id="coevolve-restore", **security.kafka_python_options())
    try:
        with tqdm(total=sum(kept.values()), desc="restore", unit="record", disable=None, leave=False) as bar:
            for (topic, partition), count in kept.items():
                _send_partition(client, database, log_id, producer, topic, partition, count)
                done.records[topic] = done.records.get(topic, 0) + count
                bar.update(count)
    finally:
        producer.close()
    _position_groups(client, database, log_id, bootstrap, kept, archiver_group, set(start_over), security, done)
    done.seconds = time.monotonic() - started
    log.info("archive.restored", log_id=log_id, records=done.records, groups=done.groups,
             started_over=done.started_over, seconds=round(done.seconds, 3))
    return done


def _require_empty(bootstrap: str, kept: dict[tuple[str, int], int], security: KafkaSecurity) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="coevolve-restore",
                             **security.kafka_python_options())
    try:
        made = {t: len(consumer.partitions_for_topic(t) or ()) for t in {t for t, _ in kept}}
        wrong = sorted(f"{t} ({n}, not {CATALOG[t].partitions})" for t, n in made.items() if n != CATALOG[t].partitions)
        if wrong:
            raise RestoreError(f"the broker at {bootstrap} has {', '.join(wrong)} partitions (a client's request made "
                               "the topic before the restore, or it was made by hand): a record's key would not find "
                               "its partition; restore into a broker without these topics")
        ends = consumer.end_offsets([TopicPartition(t, p) for t, p in kept])
    finally:
        consumer.close()
    held = sorted(f"{tp.topic}:{tp.partition}" for tp, end in ends.items() if end)
    if held:
        raise RestoreError(f"the broker at {bootstrap} already holds records in {', '.join(held)}: a log is restored "
                           "only into empty topics, where each record can land at its offset")


def _send_partition(client, database: str, log_id: str, producer: KafkaProducer, topic: str, partition: int,
                    count: int) -> None:
    sql = (f"SELECT offset, key, value, timestamp_ms, headers FROM {database}.log FINAL "
           "WHERE log_id = {log_id:String} AND topic = {topic:String} AND partition = {partition:Int32} "
           "AND offset >= {lo:Int64} AND offset < {hi:Int64} ORDER BY offset")
    for lo in range(0, count, CHUNK):
        rows = client.query(sql, parameters={"log_id": log_id, "topic": topic, "partition": partition, "lo": lo,
                                             "hi": lo + CHUNK}, query_formats={"String": "bytes"}).result_rows
        sent = [(offset, producer.send(topic, value=value, key=key, partition=partition, timestamp_ms=ts,
                                       headers=[(name.decode(), v) for name, v in headers]))
                for offset, key, value, ts, headers in rows]
        producer.flush()
        for offset, future in sent:
            landed = future.get(timeout=30).offset
            if landed != offset:
                raise RestoreError(f"{topic}:{partition} record {offset} landed at offset {landed}: the partition was "
                                   "written to during the restore; restore into a broker nothing else uses yet")


def _position_groups(client, database: str, log_id: str, bootstrap: str, kept: dict[tuple[str, int], int],
                     archiver_group: str | None, start_over: set[str], security: KafkaSecurity,
                     done: Restored) -> None:
    rows = client.query(f"SELECT group_id, topic, partition, argMax(offset, recorded_at) FROM {database}.log_positions "
                        "WHERE log_id = {log_id:String} GROUP BY group_id, topic, partition",
                        parameters={"log_id": log_id}).result_rows
    positions: dict[str, dict[TopicPartition, int]] = {}
    for group, topic, partition, offset in rows:
        positions.setdefault(group, {})[TopicPartition(topic, partition)] = offset
    if archiver_group:
        positions[archiver_group] = {TopicPartition(t, p): n for (t, p), n in kept.items()}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="coevolve-restore", request_timeout_ms=10000,
                             **security.kafka_python_options())
    try:
        for group, offsets in sorted(positions.items()):
            if group in start_over or any(tp.topic not in CATALOG for tp in offsets):
                done.started_over.append(group)
                continue
            clamped = {tp: OffsetAndMetadata(min(offset, kept.get((tp.topic, tp.partition), 0)), "", -1)
                       for tp, offset in offsets.items()}
            failed = {tp: err for tp, err in admin.alter_group_offsets(group, clamped).items() if err.errno}
            if failed:
                raise RestoreError(f"the broker refused the positions of group {group}: {failed}")
            done.groups[group] = len(clamped)
    finally:
        admin.close()
