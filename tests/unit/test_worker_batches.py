"""The worker's batch logic without Faust: a log fed through AttemptBatch and RareBatch, in batches on
one partition with every table write round-tripped through JSON (as Faust's tables store them), raises
the signals the Python replay computes, evidence included."""
from __future__ import annotations

import json
from collections import defaultdict

from coevolve.services.simulate import SimulationConfig, Simulator
from coevolve.streams import rules
from coevolve.streams.replay.engine_python import replay_signals
from coevolve.streams.worker.attempts import AttemptBatch
from coevolve.streams.worker.rare import RareBatch

LIMITS = rules.EvidenceLimits()


def _wire(value):
    return json.loads(json.dumps(value))


class Worker:
    """The three agents' table handling, as the Faust app does it, over dicts."""

    def __init__(self, th: rules.Thresholds):
        self.th = th
        self.tasks, self.markers, self.steps = {}, {}, {}
        self.last_seen, self.candidates = {}, {}
        self.open_steps, self.indexed_at = defaultdict(set), {}
        self.raised: list[rules.Signal] = []
        self.closed = {"closed_by_count": 0, "closed_by_grace": 0}
        self.now = 1000.0

    def attempts(self, messages: list[tuple[str, dict]]) -> None:
        batch = AttemptBatch(self.th, LIMITS, self.now, 2.0, self.tasks, self.markers, self.last_seen,
                             self.candidates)
        counts = []
        for name, event in messages:
            batch.seen(0, "token", trajectory=name == "TrajectoryRecorded")
            if name == "StepCompleted":  # what forward_steps sends: a marker here, the count to the rare agent
                batch.add_marker(0, _wire({"kind": "completed", "run_id": event["run_id"], "step": event["step"]}))
                counts.append({"kind": "completed", "run_id": event["run_id"], "step": event["step"],
                               "count": event["trajectory_count"]})
            elif name == "tick":  # the timer's message on the markers topic
                batch.add_marker(0, {"kind": "tick"})
            elif name == "TrajectoryRecorded":
                try:
                    batch.add_rollout(0, "token", rules.rollout_of(event, LIMITS))
                except rules.InvalidEvent:
                    pass  # dead-lettered
        batch.close_idle()
        self.raised += batch.raised
        self.tasks.update({k: _wire(v) for k, (_t, v) in batch.writes.items()})
        self.markers.update({k: _wire(v) for k, (_t, v) in batch.marker_writes().items()})
        self.rare(counts + [json.loads(body) for _key, body in batch.count_messages()])
        self.now += 0.1

    def rare(self, bodies: list[dict]) -> None:
        batch = RareBatch(self.th, LIMITS, self.now, 120.0, 60.0, self.steps, self.open_steps, self.indexed_at)
        for body in bodies:
            if body["kind"] == "tick":
                batch.tick(0, "token")
            else:
                batch.add(0, "token", body)
        self.raised += batch.raised
        self.closed = {how: n + batch.closed[how] for how, n in self.closed.items()}
        self.steps.update({k: _wire(v) for k, (_t, v) in batch.writes.items()})


def _log(seed: int) -> list[tuple[str, dict]]:
    """A simulated run with lost rollouts (their groups close short, when their step takes effect),
    invalid ones and redelivered ones (duplicates) mixed in."""
    out = []
    for i, (_topic, _key, name, event) in enumerate(Simulator(SimulationConfig(steps=12, seed=seed)).events()):
        if name == "TrajectoryRecorded" and i % 37 == 5:
            continue
        if name == "TrajectoryRecorded" and i % 53 == 7:
            event = {**event, "score": float("nan")}
        if name in ("TrajectoryRecorded", "StepCompleted"):
            out.append((name, event))
            if name == "TrajectoryRecorded" and i % 11 == 0:
                out.append((name, dict(event)))
    return out


def _live(log: list[tuple[str, dict]], th: rules.Thresholds, batch_size: int) -> Worker:
    worker = Worker(th)
    for i in range(0, len(log), batch_size):
        worker.attempts(log[i:i + batch_size])
    worker.now += 10  # the partition goes idle: at the next tick the last markers take effect
    worker.attempts([("tick", {})])
    worker.now += 121  # steps short of their trajectory count close after the grace period, incomplete
    worker.rare([{"kind": "tick"}])
    return worker


def _short_steps(log: list[tuple[str, dict]]) -> set[int]:
    """The steps with fewer valid distinct trajectories than their completed-step event claims."""
    valid: dict[int, set[str]] = defaultdict(set)
    for name, e in log:
        if name == "TrajectoryRecorded" and e["score"] == e["score"]:  # NaN is invalid
            valid[e["step"]].add(e["event_id"])
    return {e["step"] for n, e in log if n == "StepCompleted" and len(valid[e["step"]]) < e["trajectory_count"]}


def test_batches_raise_what_the_replay_computes():
    for seed, th, batch_size in ((1, rules.Thresholds(), 50), (2, rules.Thresholds(0.6, 2, 8.0, 2), 333)):
        log = _log(seed)
        expected = {s.id: s.to_json() for s in replay_signals(log, th)}
        assert {s["type"] for s in expected.values()} == set(rules.KINDS)
        worker = _live(log, th, batch_size)
        assert {s.id: s.to_json() for s in worker.raised} == expected
        steps, short = sum(n == "StepCompleted" for n, _e in log), len(_short_steps(log))
        assert worker.closed == {"closed_by_count": steps - short, "closed_by_grace": short}


def test_steps_with_every_trajectory_close_by_count_and_short_ones_by_grace():
    log = [(n, e) for _t, _k, n, e in Simulator(SimulationConfig(steps=6, seed=4)).events()
           if n in ("TrajectoryRecorded", "StepCompleted")]
    first = next(e for n, e in log if n == "TrajectoryRecorded")
    log = [(n, e) for n, e in log if e is not first]  # its step stays one short
    worker = _live(log, rules.Thresholds(), 100)
    assert _short_steps(log) == {first["step"]}
    assert worker.closed == {"closed_by_count": 5, "closed_by_grace": 1}
    assert {s.incomplete for s in worker.raised if s.kind == "rare" and s.step == first["step"]} == {True}


def test_a_marker_waits_for_the_next_step_or_the_idle_partition():
    log = _log(3)
    last_step = max(e["step"] for n, e in log if n == "StepCompleted")
    worker = Worker(rules.Thresholds())
    worker.attempts(log)
    pending = worker.markers["0"]
    assert [m["step"] for m in pending] == [last_step]  # no later trajectory made it due
    worker.now += 1.0
    worker.attempts([("tick", {})])
    assert worker.markers["0"] == pending  # idle, but not for marker_idle_s yet
    worker.now += 1.5
    worker.attempts([("tick", {})])
    assert worker.markers["0"] == []


def test_a_worker_taking_a_partition_over_waits_before_its_pending_markers_close_groups():
    log = _log(3)
    steps = sorted({e["step"] for n, e in log if n == "StepCompleted"})
    first = [(n, e) for n, e in log if e["step"] <= steps[-2]]  # the old owner: up to the next-to-last step
    rest = [(n, e) for n, e in log if e["step"] == steps[-1]]
    owner = Worker(rules.Thresholds())
    owner.attempts(first + [m for m in rest if m[0] == "StepCompleted"])  # the last step's marker came first
    assert [m["step"] for m in owner.markers["0"]] == steps[-2:]  # no later trajectory made them due
    heir = Worker(rules.Thresholds())  # a new process: the tables recovered, its own clocks fresh
    heir.tasks, heir.markers, heir.now = owner.tasks, owner.markers, owner.now + 60
    heir.attempts([("tick", {})])  # the marker has waited a minute, but this worker has not waited at all
    assert [m["step"] for m in heir.markers["0"]] == steps[-2:]
    heir.attempts([m for m in rest if m[0] == "TrajectoryRecorded"])  # read again from the committed offset
    heir.now += 2.5
    heir.attempts([("tick", {})])
    assert heir.markers["0"] == []
    live = _live(log, rules.Thresholds(), 50).raised
    ids = {s.id for s in owner.raised + heir.raised}
    assert {s.id for s in live if s.kind != "rare" and s.step >= steps[-2]} <= ids, "their groups closed whole"
