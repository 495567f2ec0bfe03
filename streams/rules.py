"""Weakness signals as pure functions over plain data: no Faust, Kafka or I/O import.

Public API (used by the Faust worker in streams/worker/, by the Python replay in streams/replay/, and
the reference the SQL engine is kept equal to):

- `Thresholds(success_threshold=0.5, window=5, rare_threshold=5.0, pattern_length=1)`: tau, W,
  theta (percent) and n; the one place their defaults are written.
- `EvidenceLimits`: how much of each trajectory a signal carries.
- `Signal`: one raised signal; `.id`, `.to_json()` (the JSON-lines form), `.to_record(ms)` (SignalRaised).
- `signal_id(kind, run_id, step, subject, thresholds)`: the first 32 hex digits of
  sha256(json.dumps([kind, run_id, step, subject, [tau, W, theta, n]], separators=(",", ":"))),
  tau and theta as floats, W and n as ints; subject is the task_id, or the pattern joined by " > ".
  `signal_order(s)`: the order signal sets are written in (run, step, kind, subject).
- `Rollout` (a NamedTuple): `rollout_of(event, limits)` from a TrajectoryRecorded event,
  `make_rollout(...)` from its fields.
- Step completion: `takes_effect(completed_step, step)` says whether a run's completed-step record
  takes effect before that run's trajectory at `step`; `closes_any(state, step)` whether it closes
  one of a task's open groups.
- Attempts, per (run, task), state `TaskState`: `new_task_state()`, `record_rollout(state, rollout, th)`
  -> (outcome, signals) with outcome ACCEPTED, DUPLICATE or LATE; `close_groups(state, step, th)`
  closes every open group at a step <= `step` (its completed-step event, or the end of the input).
  The decisions themselves: `forgets(score, previous, tau)` and `straddles(scores, tau)` (boundary).
- Rare, per (run, step), state `StepState`: `new_step_state()`, `count_rollout(state, event_id,
  task_id, keys, evidence)` with keys from `pattern_keys(names, n)`, `set_trajectory_count(state, n)`,
  `step_complete(state)`, `close_step(state, run, step, th, incomplete, limits)` -> signals. Counting
  only records the trajectory; the counts, tasks and evidence are taken at close, in bulk.

States are JSON-ready dicts (the worker's tables store them as JSON); a rollout read back from a table
is a list, which `Rollout._make` names again.

Definitions. An attempt's score is math.fsum of its rollout scores / their count. A score s succeeds
when s >= tau. forgetting: the attempt fails and one of the task's previous W closed attempts (those
with a lower step, in step order, as closed when this one closes) succeeded. boundary: the group
holds a success and a failure. rare: 0 < c_p / N < theta / 100, computed as `0 < c_p` and
`100 * c_p < theta * N`. Order: a run's completed-step record for step s takes effect just before the
first trajectory of that run with a step > s (`takes_effect`); in replay the end of the input closes
everything.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any, NamedTuple, TypedDict

KINDS = ("forgetting", "boundary", "rare")
ACCEPTED, DUPLICATE, LATE = "accepted", "duplicate", "late"
KEEP_CLOSED = 16  # closed attempts remembered per task beyond W, to tell duplicates from late rollouts
SEP = "\x1f"  # joins a pattern's names into one dict key


class InvalidEvent(ValueError):
    """An event that decodes but cannot be processed (e.g. a score that is not a number)."""


@dataclass(frozen=True)
class Thresholds:
    success_threshold: float = 0.5
    window: int = 5
    rare_threshold: float = 5.0
    pattern_length: int = 1

    def __post_init__(self) -> None:
        if not math.isfinite(self.success_threshold):
            raise ValueError("success_threshold (tau) must be a finite number")
        if self.window < 1:
            raise ValueError(f"window (W) must be at least 1 (got {self.window})")
        if not 0 <= self.rare_threshold <= 100:
            raise ValueError(f"rare_threshold (theta) is a percentage in [0, 100] (got {self.rare_threshold})")
        if self.pattern_length < 1:
            raise ValueError(f"pattern_length (n) must be at least 1 (got {self.pattern_length})")

    def key(self) -> list:
        return [float(self.success_threshold), int(self.window), float(self.rare_threshold),
                int(self.pattern_length)]

    def as_record(self) -> dict:
        tau, w, theta, n = self.key()
        return {"success_threshold": tau, "window": w, "rare_threshold": theta, "pattern_length": n}


@dataclass(frozen=True)
class EvidenceLimits:
    observation_chars: int = 200
    arguments_chars: int = 500
    max_actions: int = 64
    rare_trajectories: int = 3


def signal_id(kind: str, run_id: str, step: int, subject: str, thresholds: Thresholds) -> str:
    text = json.dumps([kind, run_id, int(step), subject, thresholds.key()], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Signal:
    kind: str
    run_id: str
    step: int
    subject: str
    thresholds: Thresholds
    task_id: str | None = None
    pattern: tuple = ()
    incomplete: bool = False
    evidence: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return signal_id(self.kind, self.run_id, self.step, self.subject, self.thresholds)

    def full_evidence(self) -> dict:
        """The evidence with every field of the SignalRaised schema, defaults filled in."""
        ev = {"scores": [], "attempt_score": None, "previous_scores": [], "pattern_count": 0,
              "pattern_total": 0, "task_ids": [], "trajectories": []}
        ev.update(self.evidence)
        return ev

    def to_json(self, evidence: bool = True) -> dict:
        out = {"id": self.id, "type": self.kind, "run_id": self.run_id, "step": self.step,
               "subject": self.subject, "task_id": self.task_id, "pattern": list(self.pattern),
               "incomplete": self.incomplete, "thresholds": self.thresholds.as_record()}
        if evidence:
            out["evidence"] = self.full_evidence()
        return out

    def to_record(self, produced_at_ms: int) -> dict:
        return {"event_id": self.id, "kind": self.kind, "run_id": self.run_id, "step": self.step,
                "subject": self.subject, "task_id": self.task_id, "pattern": list(self.pattern),
                "thresholds": self.thresholds.as_record(), "incomplete": self.incomplete,
                "evidence": self.full_evidence(), "produced_at": produced_at_ms}

    @classmethod
    def from_json(cls, data: dict) -> "Signal":
        t = data["thresholds"]
        th = Thresholds(t["success_threshold"], t["window"], t["rare_threshold"], t["pattern_length"])
        return cls(data["type"], data["run_id"], int(data["step"]), data["subject"], th,
                   data.get("task_id"), tuple(data.get("pattern") or ()), bool(data.get("incomplete")),
                   data.get("evidence") or {})

    @classmethod
    def from_record(cls, rec: dict) -> "Signal":
        return cls.from_json({**rec, "type": rec["kind"]})


class Rollout(NamedTuple):
    """What the signals need of one TrajectoryRecorded event; `evidence` is what a signal carries for it."""

    event_id: str
    run_id: str
    step: int
    task_id: str
    rollout_index: int
    group_size: int
    score: float
    names: tuple
    evidence: Any


_new_rollout = tuple.__new__  # Rollout(...) without NamedTuple's Python-level __new__: the hot path
by_member_order = attrgetter("rollout_index", "event_id")  # how a group's rollouts are ordered


def rollout_of(event: dict, limits: EvidenceLimits = EvidenceLimits()) -> Rollout:
    """Validate a TrajectoryRecorded event and keep what the signals need; raise InvalidEvent."""
    acts = event["actions"]
    score = _checked(event["score"], event["group_size"])
    oc, ac = limits.observation_chars, limits.arguments_chars
    evidence = {"event_id": event["event_id"], "task_id": event["task_id"], "rollout_index": event["rollout_index"],
                "score": score, "actions": [{"name": a["name"], "arguments": a["arguments"][:ac],
                                             "observation": a["observation"][:oc]} for a in acts[:limits.max_actions]]}
    return _new_rollout(Rollout, (event["event_id"], event["run_id"], event["step"], event["task_id"],
                                  event["rollout_index"], event["group_size"], score,
                                  tuple([a["name"] for a in acts]), evidence))


def make_rollout(event_id: str, run_id: str, step: int, task_id: str, rollout_index: int, group_size: int,
                 score, names, evidence) -> Rollout:
    """A validated rollout from its fields; raise InvalidEvent. `evidence` is what signals will carry
    for it (a decoder that fetches evidence later may pass a stand-in, such as the event id)."""
    score = _checked(score, group_size)
    return _new_rollout(Rollout, (event_id, run_id, step, task_id, rollout_index, group_size, score, tuple(names),
                                  evidence))


def _checked(score, group_size: int) -> float:
    """The score as a float, if the rollout is valid; raise InvalidEvent."""
    if not isinstance(score, (int, float)) or not math.isfinite(score):
        raise InvalidEvent(f"score is not a finite number: {score!r}")
    if group_size < 1:
        raise InvalidEvent(f"group_size must be at least 1 (got {group_size})")
    return float(score)


def pattern_keys(names, n: int) -> list[str]:
    """Every occurrence of a run of n consecutive names, as dict keys (a list, repeats kept); a
    trajectory shorter than n has none."""
    if n == 1:
        return list(names)
    return [SEP.join(names[i:i + n]) for i in range(len(names) - n + 1)]


# ---- step completion: when a completed step takes effect ----

def takes_effect(completed_step: int, step: int) -> bool:
    """Whether a run's completed-step record for `completed_step` takes effect before that run's
    trajectory at `step`: it does before the first trajectory with a higher step."""
    return completed_step < step


def closes_any(state: "TaskState", step: int) -> bool:
    """Whether a completed step `step` closes one of the task's open groups (those at a step <= it)."""
    return any(int(k) <= step for k in state["open"])


# ---- attempts: forgetting and boundary, per (run, task) ----

class TaskState(TypedDict):
    """A task's attempts in one run. open: step (str) -> [group_size, [rollout, ...]]; closed:
    [[step, score, [event ids]], ...] sorted by step; horizon: the highest step forgotten from `closed`."""

    open: dict[str, list]
    closed: list[list]
    horizon: int | None


def new_task_state() -> TaskState:
    return {"open": {}, "closed": [], "horizon": None}


def record_rollout(state: TaskState, r: Rollout, th: Thresholds) -> tuple[str, list[Signal]]:
    """Add one rollout to its group; close the group when it holds group_size distinct rollouts."""
    key = str(r.step)
    group = state["open"].get(key)
    if group is None:
        for c_step, _score, ids in state["closed"]:
            if c_step == r.step:
                return (DUPLICATE if r.event_id in ids else LATE), []
        horizon = state["horizon"]
        if horizon is not None and r.step <= horizon:
            return LATE, []
        group = state["open"][key] = [r.group_size, []]
    rollouts = group[1]
    eid = r.event_id
    for other in rollouts:
        if other[0] == eid:  # a rollout read back from a table is a list
            return DUPLICATE, []
    rollouts.append(r)
    if len(rollouts) >= group[0]:
        return ACCEPTED, _close(state, key, th)
    return ACCEPTED, []


def close_groups(state: TaskState, step: int, th: Thresholds) -> list[Signal]:
    """Close every open group at a step <= `step`, lowest step first, with what it has."""
    keys = sorted((k for k in state["open"] if int(k) <= step), key=int)
    out: list[Signal] = []
    for key in keys:
        out += _close(state, key, th)
    return out


def _close(state: TaskState, key: str, th: Thresholds) -> list[Signal]:
    _size, members = state["open"].pop(key)
    if type(members[0]) is not Rollout:  # read back from a table (JSON): lists, older than any Rollout
        members = [Rollout._make(m) for m in members]
    rollouts = sorted(members, key=by_member_order)
    r0 = rollouts[0]
    run_id, step, task_id = r0.run_id, r0.step, r0.task_id
    scores = [r.score for r in rollouts]
    score = math.fsum(scores) / len(scores)
    tau = th.success_threshold
    closed = state["closed"]
    steps = [c[0] for c in closed]
    at = bisect.bisect_left(steps, step)
    previous = [c[1] for c in closed[max(0, at - th.window):at]]
    out = []
    evidence = None
    if forgets(score, previous, tau):
        evidence = _attempt_evidence(rollouts, scores, score, previous)
        out.append(Signal("forgetting", run_id, step, task_id, th, task_id=task_id, evidence=evidence))
    if straddles(scores, tau):
        evidence = evidence or _attempt_evidence(rollouts, scores, score, previous)
        out.append(Signal("boundary", run_id, step, task_id, th, task_id=task_id, evidence=evidence))
    closed.insert(at, [step, score, [r.event_id for r in rollouts]])
    _forget_old(state, max(th.window, KEEP_CLOSED))
    return out


def forgets(score: float, previous: list[float], tau: float) -> bool:
    """forgetting: the attempt fails and one of the previous W attempts succeeded."""
    return score < tau and any(p >= tau for p in previous)


def straddles(scores: list[float], tau: float) -> bool:
    """boundary: the group's rollouts hold a success and a failure."""
    return any(s >= tau for s in scores) and any(s < tau for s in scores)


def _forget_old(state: TaskState, keep: int) -> None:
    """Keep the `keep` highest-step closed attempts; the horizon remembers how far the rest reached."""
    closed = state["closed"]
    if len(closed) > keep:
        top = closed[len(closed) - keep - 1][0]
        del closed[: len(closed) - keep]
        state["horizon"] = top if state["horizon"] is None else max(state["horizon"], top)


def _attempt_evidence(rollouts: list[Rollout], scores, score, previous) -> dict:
    return {"scores": scores, "attempt_score": score, "previous_scores": previous,
            "trajectories": [r.evidence for r in rollouts]}


# ---- rare: per (run, step) ----

class StepState(TypedDict):
    """A step's rare counting. expected: its trajectory_count (None until its completed-step event);
    seen: event ids counted; rows: [[event_id, task_id, pattern keys], ...] in counting order;
    evidence: event_id -> trajectory, for those a signal may carry; closed: done. Counts are taken
    when the step closes. (The worker's table adds p, run_id, step and touched.)"""

    expected: int | None
    seen: dict[str, int]
    rows: list[list]
    evidence: dict[str, Any]
    closed: bool


def new_step_state() -> StepState:
    return {"expected": None, "seen": {}, "rows": [], "evidence": {}, "closed": False}


def count_rollout(state: StepState, event_id: str, task_id: str, keys: list, evidence) -> bool:
    """Count one trajectory's pattern keys (from `pattern_keys`) once, by event id; `evidence` is what a
    signal would carry for it (None: it cannot be among the smallest ids; see `offer_candidate`).
    Return whether it was new."""
    seen = state["seen"]
    if state["closed"] or event_id in seen:
        return False
    seen[event_id] = 1
    state["rows"].append([event_id, task_id, keys])
    if evidence is not None:
        state["evidence"][event_id] = evidence
    return True


def offer_candidate(best: dict, event_id: str, keys, keep: int) -> bool:
    """Track, per pattern, the `keep` smallest event ids seen so far (by one sender); return whether
    this trajectory is among them for some pattern. If not, it cannot be among the smallest of all
    senders either, so its evidence need not be sent to `count_rollout`."""
    wanted = False
    for p in set(keys):
        ids = best.get(p)
        if ids is None:
            best[p] = [event_id]
            wanted = keep > 0
        elif len(ids) < keep or (keep > 0 and event_id < ids[-1]):
            bisect.insort(ids, event_id)
            del ids[keep:]
            wanted = True
    return wanted


def set_trajectory_count(state: StepState, count: int) -> None:
    state["expected"] = count


def step_complete(state: StepState) -> bool:
    return state["expected"] is not None and len(state["seen"]) >= state["expected"]


def close_step(state: StepState, run_id: str, step: int, th: Thresholds, incomplete: bool,
               limits: EvidenceLimits = EvidenceLimits()) -> list[Signal]:
    """Raise rare for every pattern with 0 < c_p / N < theta / 100, with the tasks that used it and the
    evidence of its `limits.rare_trajectories` smallest event ids; mark the step closed."""
    state["closed"] = True
    rows = state["rows"]
    counts = Counter(chain.from_iterable(row[2] for row in rows))
    total = sum(counts.values())
    limit = th.rare_threshold * total
    rare = {p for p, c in counts.items() if 0 < c and 100 * c < limit}
    out = []
    if rare:
        tasks: dict[str, set] = {p: set() for p in rare}
        ids: dict[str, list] = {p: [] for p in rare}
        for event_id, task_id, keys in rows:
            for p in rare.intersection(keys):
                tasks[p].add(task_id)
                ids[p].append(event_id)
        evidence, keep = state["evidence"], limits.rare_trajectories
        for p in sorted(rare):
            out.append(rare_signal(run_id, step, p, th, incomplete, {
                "pattern_count": counts[p], "pattern_total": total, "task_ids": sorted(tasks[p]),
                "trajectories": [evidence.get(e) for e in sorted(ids[p])[:keep]]}))
    state["seen"], state["rows"], state["evidence"] = {}, [], {}
    return out


def rare_signal(run_id: str, step: int, key: str, th: Thresholds, incomplete: bool, evidence: dict | None = None) -> Signal:
    """The rare signal of a pattern key (n names joined by SEP); its subject joins them by " > "."""
    pattern = tuple(key.split(SEP))
    return Signal("rare", run_id, step, " > ".join(pattern), th, pattern=pattern, incomplete=bool(incomplete),
                  evidence=evidence or {})


def signal_order(s: Signal) -> tuple:
    """The order signal sets are written in when sorted: run, step, kind, subject."""
    return (s.run_id, s.step, s.kind, s.subject)


