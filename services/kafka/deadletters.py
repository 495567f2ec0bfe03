"""Working with dead letters: what was rejected, by whom and why (`coevolve deadletters list`), and
putting the original bytes back on their source topic once their cause is fixed (`... replay`).

A replay re-publishes each chosen letter's payload, byte for byte, with its original key, so the event
keeps its `event_id` and every consumer that already holds it absorbs it. It reads `coevolve.deadletter`
in a consumer group of its own per filter (`coevolve-deadletters-replay.<reason>.<service>`) and
commits after the broker confirmed every re-publication: a second replay with the same filter sends
only the letters that arrived since, and one interrupted before its commit sends the same bytes again,
which the consumers absorb as any redelivery.

A letter's fields are written by whichever service rejected the input, and any client may write one, so
none is trusted: a letter is replayed only when the record at its source topic, partition and offset is
still on the broker and is its payload (the same bytes, or the same event re-encoded), and that payload
decodes to the record type its source topic carries. A forged letter can therefore put back only what
the topic already held, never new content. `coevolve.tasks` is what the learner trains on and only the
validator writes it: its letters are held back unless the operator names the topic (`--topic
coevolve.tasks`) and the letter came from the validator's own read of it. The learner rereads
`coevolve.tasks` from its beginning at every start, so its letters on that topic need a restart, not a
replay. Held letters are reported with the reason and their offsets committed like the others.
"""
from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

from coevolve.schemas import DecodeError, default_registry
from coevolve.services.kafka.consumer import Delivered, EventConsumer
from coevolve.services.kafka.offsets import true_end_offsets
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import CATALOG, DEADLETTER, TASKS

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_ms(text: str, now_s: float | None = None) -> int:
    """`--since` as Unix milliseconds: a duration back from now (`90s`, `30m`, `2h`, `7d`) or an ISO
    8601 time (UTC when it names no zone)."""
    now_s = time.time() if now_s is None else now_s
    match = _DURATION.match(text.strip())
    if match:
        return int((now_s - float(match[1]) * _UNIT_S[match[2]]) * 1000)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text!r} is neither a duration (90s, 30m, 2h, 7d) nor an ISO 8601 time "
                         "(2026-12-02T10:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


def produced_ms(letter: dict) -> int:
    """A letter's `produced_at` in Unix ms (decoded events carry it as an aware datetime)."""
    value = letter["produced_at"]
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else int(value)


def read_letters(bootstrap: str, since: int | None = None) -> list[dict]:
    """Every dead letter on the broker (produced at or after `since`, Unix ms), oldest first."""
    reader = EventConsumer(bootstrap, [DEADLETTER.name], service="deadletters")
    try:
        letters = [i.event for i in reader.read_to_end() if i.name == "DeadLettered"]
    finally:
        reader.close()
    unique = {str(e["event_id"]): e for e in letters}  # a redelivered bad input is one letter
    return sorted((e for e in unique.values() if since is None or produced_ms(e) >= since), key=produced_ms)


@dataclass
class Summary:
    """Counts by (service, reason) and the newest letters of each."""

    counts: Counter = field(default_factory=Counter)
    newest: dict[tuple[str, str], list[dict]] = field(default_factory=dict)


def summarize(letters: list[dict], examples: int = 3) -> Summary:
    out = Summary()
    for letter in letters:
        key = (str(letter["service"]), str(letter["error_type"]))
        out.counts[key] += 1
        out.newest.setdefault(key, []).append(letter)
    for key, group in out.newest.items():
        out.newest[key] = group[-examples:][::-1]
    return out


# The validator's readers of coevolve.tasks: the only letters that may go back onto it.
TASK_WRITERS = ("validator", "validator-catalog")


def replay_group(error_type: str, service: str | None, topic: str | None = None) -> str:
    return f"coevolve-deadletters-replay.{error_type}.{service or 'any'}" + (f".{topic}" if topic else "")


def _matches(letter: dict, error_type: str, service: str | None, topic: str | None) -> bool:
    return (letter["error_type"] == error_type and (service is None or letter["service"] == service)
            and (topic is None or letter["source_topic"] == topic))


def held_back(letter: dict, topic: str | None) -> str | None:
    """Why the letter may not be replayed to its source topic, or None when it may (`topic`: the topic the
    operator named)."""
    target = str(letter["source_topic"])
    carried = CATALOG.get(target)
    if carried is None or carried is DEADLETTER:
        return f"{target!r} is not a topic a replay writes (the catalog's event topics: {', '.join(CATALOG)})"
    try:
        name, _ = default_registry().decode(bytes(letter["payload"]))
    except DecodeError as exc:
        return f"its payload does not decode ({exc}); a replay would only be dead-lettered again"
    if name != carried.event:
        return f"its payload is {name}, and {target} carries {carried.event} only"
    if target == TASKS.name and (topic != TASKS.name or letter["service"] not in TASK_WRITERS):
        return (f"{TASKS.name} is the validator's output: replayed only from the validator's own read of it, "
                f"and only with --topic {TASKS.name} (the learner rereads it at every start: restart it instead)")
    return None


def unproven(letter: dict, record: bytes | None) -> str | None:
    """Why the record found at the letter's source position (None: none there) does not prove the letter's
    payload, or None when it does."""
    where = f"{letter['source_topic']}:{letter['source_partition']}@{letter['source_offset']}"
    if record is None:
        return f"no record is at {where} any more (retention or compaction), so nothing proves its payload"
    payload = bytes(letter["payload"])
    if record == payload:
        return None
    registry = default_registry()
    try:
        if registry.decode(record) == registry.decode(payload):  # rejected events are re-encoded
            return None
    except DecodeError:
        pass
    return f"its payload is not the record at {where}: a letter may only put back what its topic held"


def _records_at(bootstrap: str, letters: list[dict], timeout_s: float = 10.0) -> dict[tuple, bytes]:
    """The records at the letters' source positions that are still on the broker, by (topic, partition, offset)."""
    from kafka import KafkaConsumer, TopicPartition

    from coevolve.services.kafka.security import KafkaSecurity

    wanted: dict[TopicPartition, set[int]] = {}
    for letter in letters:
        tp = TopicPartition(str(letter["source_topic"]), int(letter["source_partition"]))
        wanted.setdefault(tp, set()).add(int(letter["source_offset"]))
    found: dict[tuple, bytes] = {}
    if not wanted:
        return found
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             client_id="coevolve-deadletters-proof",
                             **KafkaSecurity.from_environment().kafka_python_options())
    try:
        wanted = {tp: offsets for tp, offsets in wanted.items()  # a partition a letter invented has no record
                  if tp.partition in (consumer.partitions_for_topic(tp.topic) or set())}
        if not wanted:
            return found
        consumer.assign(list(wanted))
        reported = consumer.end_offsets(list(wanted))
        ends = true_end_offsets(bootstrap, {(tp.topic, tp.partition): reported[tp] for tp in wanted})
        for tp, offsets in wanted.items():
            first, last = min(offsets), min(max(offsets) + 1, ends[(tp.topic, tp.partition)] or 0)
            if first >= last:
                continue
            consumer.pause(*[other for other in wanted if other != tp])
            consumer.resume(tp)
            consumer.seek(tp, first)
            deadline = time.monotonic() + timeout_s
            while consumer.position(tp) < last and time.monotonic() < deadline:
                for message in consumer.poll(timeout_ms=200).get(tp, []):
                    if message.offset in offsets:
                        found[(tp.topic, tp.partition, message.offset)] = message.value
        return found
    finally:
        consumer.close()


@dataclass
class Replayed:
    """The letters a replay sent, and those it held back with the reason."""

    sent: list[dict] = field(default_factory=list)
    held: list[tuple[dict, str]] = field(default_factory=list)


def republish(bootstrap: str, error_type: str, service: str | None = None, topic: str | None = None,
           join_timeout_s: float = 60.0) -> Replayed:
    """Re-publish every not yet replayed letter of `error_type` (from `service`, of `topic`) whose payload
    belongs on its source topic (`held_back`) to that topic."""
    consumer = EventConsumer(bootstrap, [DEADLETTER.name], group_id=replay_group(error_type, service, topic),
                             service="deadletters-replay")
    producer = EventProducer(bootstrap, client_id="coevolve-deadletters-replay")
    try:
        taken: list[Delivered] = []
        deadline = time.monotonic() + join_timeout_s
        while not consumer.assigned():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replay's consumer group did not join within {join_timeout_s:.0f} s; "
                                   f"check that the broker at {bootstrap} runs")
            taken += consumer.poll(0.5)
        taken += consumer.read_to_end()
        chosen = list({str(i.event["event_id"]): i.event for i in taken
                       if i.name == "DeadLettered" and _matches(i.event, error_type, service, topic)}.values())
        out = Replayed()
        held = [held_back(letter, topic) for letter in chosen]
        records = _records_at(bootstrap, [letter for letter, why in zip(chosen, held) if why is None])
        for letter, why in zip(chosen, held):
            position = (str(letter["source_topic"]), int(letter["source_partition"]), int(letter["source_offset"]))
            why = why or unproven(letter, records.get(position))
            if why is not None:
                out.held.append((letter, why))
                continue
            producer.send_raw(str(letter["source_topic"]), bytes(letter["payload"]), letter["key"],
                              str(letter["event_id"]))
            out.sent.append(letter)
        producer.flush()
        if not consumer.commit():
            raise RuntimeError("the replay's offsets were not committed (its group rebalanced); run it again: "
                               "the letters it sent are absorbed as redeliveries")
        return out
    finally:
        consumer.close()
        producer.close()
