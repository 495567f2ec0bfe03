"""Which signals the explorer explores at each training step, and the ids of what it publishes.

Budget. Signals are gathered per run and period (`every_steps` training steps; one step by default).
A period closes `step_grace_s` after the `StepCompleted` of its last step arrives, or `step_window_s`
after its first signal when that event never comes. The grace is needed: signals are raised from the
step's trajectories by other processes and arrive after its `StepCompleted` (a rare signal only once
the step's counts are complete), and one poll can hand over a step's `StepCompleted` before its
signals. A signal for a period that already closed opens it again, due after the grace. At close, the signals of the selected kinds are grouped into
clusters (with `cluster_by_task`, a task's forgetting and boundary signals form one cluster; a rare
signal, which names an action pattern rather than a task, is its own cluster) and the first
`signals_per_step` clusters are explored, in this priority:

1. the cluster's best kind: forgetting (a capability lost), then boundary (unstable), then rare;
2. ties by recency: the later step, then the later `produced_at`, then the later arrival.

The other clusters' signals are counted as `skipped` (a metric), and signals of kinds the config does
not explore as `ignored`. A signal id seen before is dropped, so a redelivered signal plans nothing.
With `fallback_tasks`, a period's last `StepCompleted` also opens the period when no signal did, so
a step without signals still closes into a (signal-less) plan that the fallback explores.

Ids. An exploration's id is a hash of its source id (the cluster's first signal, or for unguided runs
`random_source_id` of the strategy, run, step and task) and its round, so redelivery republishes the same ids and consumers dedupe.
"""
from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from coevolve.services.explorer.config import ExplorerConfig

PRIORITY = {"forgetting": 0, "boundary": 1, "rare": 2}
_REMEMBERED_IDS = 100_000


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()[:32]


def exploration_id(source_id: str, round_: int) -> str:
    """The id of round `round_` explored for `source_id` (a signal id, or `random_source_id`)."""
    return _hash("exploration", source_id, int(round_))


def random_source_id(run_id: str, step: int, task_id: str, strategy: str = "random") -> str:
    """The source id of unguided exploration (`random`, or `random-fallback`) of a task at a step."""
    return _hash(strategy, run_id, int(step), task_id)


def pick_random_tasks(task_ids: Sequence[str], count: int, run_id: str, step: int, seed: int) -> list[str]:
    """`count` distinct tasks for unguided exploration at a step; the same inputs give the same tasks."""
    pool = sorted(set(task_ids))
    return random.Random(f"{seed}:{run_id}:{step}").sample(pool, min(count, len(pool)))


def _millis(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value or 0)


@dataclass(frozen=True)
class SignalRef:
    """What planning needs of a `SignalRaised` event; `record` keeps the whole event for reflection."""

    signal_id: str
    kind: str
    run_id: str
    step: int
    task_id: str | None
    produced_ms: int
    arrival: int
    record: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], arrival: int = 0) -> "SignalRef":
        """Read a decoded `SignalRaised`; a rare signal's task is the first task its evidence names."""
        evidence = record.get("evidence") or {}
        tasks = list(evidence.get("task_ids") or []) + [t["task_id"] for t in evidence.get("trajectories") or []]
        task_id = record.get("task_id") or (tasks[0] if tasks else None)
        return cls(str(record["event_id"]), str(record["kind"]), str(record["run_id"]), int(record["step"]),
                   task_id, _millis(record.get("produced_at")), arrival, record)

    def order(self) -> tuple:
        """Sort key: priority of the kind, then most recent first."""
        return (PRIORITY[self.kind], -self.step, -self.produced_ms, -self.arrival)


@dataclass(frozen=True)
class Cluster:
    """Related signals explored together; the first one names the cluster."""

    signals: tuple[SignalRef, ...]

    @property
    def primary(self) -> SignalRef:
        return self.signals[0]

    @property
    def source_id(self) -> str:
        return self.primary.signal_id

    @property
    def task_id(self) -> str | None:
        return self.primary.task_id

    @property
    def signal_ids(self) -> list[str]:
        return [s.signal_id for s in self.signals]

    def order(self) -> tuple:
        best = min(PRIORITY[s.kind] for s in self.signals)
        newest = min((-s.step, -s.produced_ms, -s.arrival) for s in self.signals)
        return (best, *newest)


def cluster_signals(signals: Sequence[SignalRef], by_task: bool = True) -> list[Cluster]:
    """Group signals into clusters, in exploration priority order."""
    groups: dict[str, list[SignalRef]] = {}
    for s in signals:
        key = f"task:{s.task_id}" if by_task and s.kind != "rare" and s.task_id else f"signal:{s.signal_id}"
        groups.setdefault(key, []).append(s)
    clusters = [Cluster(tuple(sorted(group, key=SignalRef.order))) for group in groups.values()]
    return sorted(clusters, key=Cluster.order)


@dataclass(frozen=True)
class Plan:
    """What one closed period explores, and what it leaves."""

    run_id: str
    first_step: int
    last_step: int
    chosen: tuple[Cluster, ...]
    skipped: int
    ignored: int
    closed_by: str
    """`step` (its StepCompleted arrived), `window` (the time window ran out), or `start` (the static
    strategy's one exploration when the explorer starts)."""
    gathered: int = 0
    """Signals gathered in the period (0: a step without signals, closed for the fallback)."""


def choose(signals: Sequence[SignalRef], config: ExplorerConfig) -> tuple[tuple[Cluster, ...], int, int]:
    """The clusters to explore, the skipped signal count and the ignored (unselected kind) count."""
    wanted = [s for s in signals if s.kind in config.kinds]
    clusters = cluster_signals(wanted, config.cluster_by_task)
    chosen = tuple(clusters[:config.signals_per_step])
    skipped = sum(len(c.signals) for c in clusters[config.signals_per_step:])
    return chosen, skipped, len(signals) - len(wanted)


@dataclass
class _Period:
    opened_at: float
    signals: list[SignalRef] = field(default_factory=list)
    due_at: float | None = None
    """When its last step's StepCompleted (plus the grace) closes it; None until that event came."""


class SignalBuffer:
    """Gathers signals per (run, period) and closes periods into plans. Plain state, no I/O."""

    def __init__(self, config: ExplorerConfig):
        self.config = config
        self._open: dict[tuple[str, int], _Period] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._completed: dict[str, int] = {}  # the last completed step per run
        self._closed: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._arrivals = 0

    def _last_step(self, key: tuple[str, int]) -> int:
        return (key[1] + 1) * self.config.every_steps - 1

    def add(self, record: Mapping[str, Any], now: float) -> bool:
        """Gather one decoded `SignalRaised`; False when its id was seen before."""
        signal_id = str(record["event_id"])
        if signal_id in self._seen:
            return False
        self._seen[signal_id] = None
        if len(self._seen) > _REMEMBERED_IDS:
            self._seen.popitem(last=False)
        self._arrivals += 1
        ref = SignalRef.from_record(record, self._arrivals)
        key = (ref.run_id, ref.step // self.config.every_steps)
        period = self._open.setdefault(key, _Period(now))
        if period.due_at is None and self._completed.get(ref.run_id, -1) >= self._last_step(key):
            period.due_at = now + self.config.step_grace_s  # its step is complete: a late signal
        period.signals.append(ref)
        return True

    def step_completed(self, run_id: str, step: int, now: float) -> list[Plan]:
        """Make every open period of the run whose last step is at most `step` due after the grace;
        the plans already due."""
        self._completed[run_id] = max(step, self._completed.get(run_id, -1))
        key = (run_id, step // self.config.every_steps)
        ends_period = self._last_step(key) == step
        if self.config.fallback_tasks and ends_period and key not in self._open and key not in self._closed:
            self._open[key] = _Period(now)
        for k, period in self._open.items():
            if k[0] == run_id and self._last_step(k) <= step and period.due_at is None:
                period.due_at = now + self.config.step_grace_s
        return self.expire(now)

    def key_of(self, run_id: str, step: int) -> tuple[str, int]:
        """The (run, period) a step belongs to: what a plan closes and `Holds` keys by."""
        return run_id, step // self.config.every_steps

    def due_keys(self, run_id: str, step: int) -> list[tuple[str, int]]:
        """The open periods a `StepCompleted` of `step` made due (they wait for their grace)."""
        return [k for k in self._open if k[0] == run_id and self._last_step(k) <= step]

    def expire(self, now: float) -> list[Plan]:
        """Close every period due, or opened at least `step_window_s` ago."""
        due = [k for k, p in self._open.items() if p.due_at is not None and now >= p.due_at]
        late = [k for k, p in self._open.items() if k not in due and now - p.opened_at >= self.config.step_window_s]
        return sorted([self._close(k, "step") for k in due] + [self._close(k, "window") for k in late],
                      key=lambda plan: (plan.run_id, plan.first_step))

    def _close(self, key: tuple[str, int], closed_by: str) -> Plan:
        period = self._open.pop(key)
        self._closed[key] = None
        if len(self._closed) > _REMEMBERED_IDS:
            self._closed.popitem(last=False)
        chosen, skipped, ignored = choose(period.signals, self.config)
        every = self.config.every_steps
        return Plan(key[0], key[1] * every, key[1] * every + every - 1, chosen, skipped, ignored, closed_by,
                    len(period.signals))

    @property
    def pending(self) -> int:
        """Signals gathered in periods not yet closed."""
        return sum(len(p.signals) for p in self._open.values())

    @property
    def waiting(self) -> bool:
        """Whether any period is open (with signals, or a step's awaiting the fallback)."""
        return bool(self._open)
