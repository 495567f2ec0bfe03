"""True end offsets, for brokers that report them short.

Tansu 0.6 answers ListOffsets(latest) with the *last batch's base offset + 1*, so a partition whose last
batch holds k records reports an end k - 1 too low. Anything that reads "up to the end" (Faust's table
recovery among them) then stops short and silently loses the tail. A fetch from `reported - 1` returns
that whole last batch, whose last offset + 1 is the true end. On a broker that reports ends correctly the
probe finds nothing beyond them and changes nothing.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TypeVar

from kafka import KafkaConsumer, TopicPartition

from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.runtime.log import get_logger

log = get_logger("broker")
TP = TypeVar("TP", bound=tuple)
PROBE_TIMEOUT_S = 5.0


def true_end_offsets(bootstrap: str, reported: Mapping[TP, int | None],
                     timeout_s: float = PROBE_TIMEOUT_S,
                     security: KafkaSecurity | None = None, unprobed: set[TP] | None = None) -> dict[TP, int | None]:
    """`reported` end offsets ((topic, partition) -> end), raised to one past each partition's last record;
    the partitions whose last record did not come by `timeout_s` are added to `unprobed` (their reported
    ends are kept, and on Tansu they may be short)."""
    ends = dict(reported)
    probe = {TopicPartition(tp[0], tp[1]): tp for tp, end in reported.items() if end}
    if not probe:
        return ends
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             client_id="coevolve-end-offsets", max_poll_records=1_000_000,
                             **(security or KafkaSecurity.from_environment()).kafka_python_options())
    try:
        consumer.assign(list(probe))
        for ktp, tp in probe.items():
            consumer.seek(ktp, reported[tp] - 1)
        waiting = set(probe)
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for ktp, records in consumer.poll(timeout_ms=200).items():
                if records:
                    tp = probe[ktp]
                    ends[tp] = max(ends[tp], records[-1].offset + 1)
                    waiting.discard(ktp)
                    consumer.pause(ktp)
    finally:
        consumer.close()
    if unprobed is not None:
        unprobed.update(probe[ktp] for ktp in waiting)
    if waiting:
        log.warning("end_offsets.unprobed", partitions=sorted(f"{t.topic}:{t.partition}" for t in waiting),
                    timeout_s=timeout_s, hint="their reported ends are kept; on Tansu they may be short")
    return ends
