"""Working with dead letters: what was rejected, by whom and why (`coevolve deadletters list`), and
putting the original bytes back on their source topic once their cause is fixed (`... replay`).

A replay re-publishes each chosen letter's payload, byte for byte, with its original key, so the event
keeps its `event_id` and every consumer that already holds it absorbs it. It reads `coevolve.deadletter`
in a consumer group of its own per filter (`coevolve-deadletters-replay.<reason>.<service>`) and
commits after the broker confirmed every re-publication: a second replay with the same filter sends
only the letters that arrived since, and one interrupted before its commit sends the same bytes again,
which the consumers absorb as any redelivery.
"""
from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

from coevolve.services.kafka.consumer import Delivered, EventConsumer
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER

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


def replay_group(error_type: str, service: str | None) -> str:
    return f"coevolve-deadletters-replay.{error_type}.{service or 'any'}"


def _matches(letter: dict, error_type: str, service: str | None) -> bool:
    return letter["error_type"] == error_type and (service is None or letter["service"] == service)


def replay(bootstrap: str, error_type: str, service: str | None = None, join_timeout_s: float = 60.0) -> list[dict]:
    """Re-publish every not yet replayed letter of `error_type` (from `service`) to its source topic; the
    letters sent."""
    consumer = EventConsumer(bootstrap, [DEADLETTER.name], group_id=replay_group(error_type, service),
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
                       if i.name == "DeadLettered" and _matches(i.event, error_type, service)}.values())
        for letter in chosen:
            producer.send_raw(str(letter["source_topic"]), bytes(letter["payload"]), letter["key"],
                              str(letter["event_id"]))
        producer.flush()
        if not consumer.commit():
            raise RuntimeError("the replay's offsets were not committed (its group rebalanced); run it again: "
                               "the letters it sent are absorbed as redeliveries")
        return chosen
    finally:
        consumer.close()
        producer.close()
