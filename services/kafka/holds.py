"""What a service still holds in open state (a period waiting for its grace, a group waiting for its
rounds): the records a commit must not pass.

A service that commits only when nothing is open never commits inside a long backlog, and a crash there
re-reads all of it. With holds it commits everything before the oldest record an open period or group
still needs, per partition (`EventConsumer.commit(below=...)`), and a crash re-reads from there.
"""
from __future__ import annotations

from collections.abc import Hashable

from coevolve.services.kafka.consumer import Delivered


class Holds:
    """Per key, the lowest offset held on each (topic, partition)."""

    def __init__(self) -> None:
        self._held: dict[Hashable, dict[tuple[str, int], int]] = {}

    def hold(self, key: Hashable, item: Delivered) -> None:
        held = self._held.setdefault(key, {})
        tp = (item.topic, item.partition)
        held[tp] = min(held.get(tp, item.offset), item.offset)

    def release(self, key: Hashable) -> None:
        self._held.pop(key, None)

    def floor(self) -> dict[tuple[str, int], int]:
        """The offset each partition may be committed up to (excluded): its lowest held record."""
        out: dict[tuple[str, int], int] = {}
        for held in self._held.values():
            for tp, offset in held.items():
                out[tp] = min(out.get(tp, offset), offset)
        return out

    def commit(self, consumer, delivered: dict) -> tuple[bool, dict]:
        """Commit `consumer` up to the held records; with the delivered items (id -> `Delivered`) a later
        reject may still need: those at or past their partition's floor."""
        floor = self.floor()
        kept = {key: item for key, item in delivered.items()
                if item.offset >= floor.get((item.topic, item.partition), item.offset + 1)}
        return consumer.commit(below=floor), kept

    def __len__(self) -> int:
        return len(self._held)
