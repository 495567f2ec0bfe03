"""Group exploration runs into what one proposal is abstracted from: the rounds of one source on one task.

A group's key is (run, source, task): the source is the explored cluster's first signal, or for
unguided runs the step. A group is complete when `rounds` distinct rounds have arrived; `expire`
hands over groups that waited too long with fewer. A redelivered event (same id) is ignored.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

_REMEMBERED_IDS = 100_000


def group_key(event: Mapping[str, Any]) -> tuple[str, str, str]:
    source = event.get("signal_id") or f"random@{event['step']}"
    return (str(event["run_id"]), str(source), str(event["task_id"]))


@dataclass
class _Open:
    opened_at: float
    events: dict[int, Mapping[str, Any]] = field(default_factory=dict)


class ExplorationGroups:
    """Plain state: open groups by key, and the ids already taken."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self._open: dict[tuple[str, str, str], _Open] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()

    def add(self, event: Mapping[str, Any], now: float) -> list[Mapping[str, Any]] | None:
        """Take one `ExplorationRecorded`; the group's events, by round, once it is complete."""
        if event["event_id"] in self._seen:
            return None
        self._seen[event["event_id"]] = None
        if len(self._seen) > _REMEMBERED_IDS:
            self._seen.popitem(last=False)
        key = group_key(event)
        group = self._open.setdefault(key, _Open(now))
        group.events.setdefault(int(event["round"]), event)
        if len(group.events) < self.rounds:
            return None
        del self._open[key]
        return [group.events[r] for r in sorted(group.events)]

    def is_open(self, key: tuple[str, str, str]) -> bool:
        return key in self._open

    def expire(self, now: float, max_wait_s: float) -> list[list[Mapping[str, Any]]]:
        """Incomplete groups opened at least `max_wait_s` ago, by round."""
        keys = [k for k, g in self._open.items() if now - g.opened_at >= max_wait_s]
        return [[g.events[r] for r in sorted(g.events)] for g in (self._open.pop(k) for k in keys)]

    @property
    def pending(self) -> int:
        """Explorations held in groups not yet complete."""
        return sum(len(g.events) for g in self._open.values())
