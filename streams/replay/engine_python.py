"""The Python engine of `coevolve replay`: the log, in order, through the pure rules of streams/rules.py.

`Replayer` takes (record name, event) pairs or compacted rollouts in log order; completed-step records
are read first and take effect by position (`rules.takes_effect`); `finish()` closes what the end of
the input leaves open. `replay_files` and `replay_topics` feed it from the sources of `sources.py`.
"""
from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from pathlib import Path

from coevolve.streams.replay.report import ReplayResult
from coevolve.streams.replay.sources import (chdb_rollouts, evidence_of, fastavro_rollouts, file_steps, read_topics,
                                             split_inputs)
from coevolve.streams.rules import (ACCEPTED, DUPLICATE, LATE, EvidenceLimits, InvalidEvent, Rollout, Signal,
                                    StepState, TaskState, Thresholds, close_groups, close_step, count_rollout,
                                    new_step_state, new_task_state, pattern_keys, record_rollout, rollout_of,
                                    set_trajectory_count, step_complete, takes_effect)


class Replayer:
    """Feed (record name, event) pairs in log order; `finish()` closes everything left open.

    Trajectory events may also be fed already compacted by `rollout_of` via `add_rollout`. Nothing
    raises: `outcomes` counts accepted, duplicate, late and invalid rollouts, `invalid` lists the
    invalid ones with the reason.
    """

    def __init__(self, thresholds: Thresholds = Thresholds(), limits: EvidenceLimits = EvidenceLimits()):
        self.th = thresholds
        self.limits = limits
        self.tasks: dict[tuple[str, str], TaskState] = {}
        self.steps: dict[tuple[str, int], StepState] = {}
        self.open_by_step: dict[tuple[str, int], set] = {}
        self.pending: dict[str, list[tuple[int, int]]] = {}  # run -> sorted (step, count), not yet applied
        self.signals: list[Signal] = []
        self.outcomes = {ACCEPTED: 0, DUPLICATE: 0, LATE: 0, "invalid": 0}
        self.invalid: list[tuple[str, str]] = []

    def add_step(self, event: dict) -> None:
        bisect.insort(self.pending.setdefault(event["run_id"], []), (event["step"], event["trajectory_count"]))

    def add_event(self, name: str, event: dict) -> None:
        if name == "TrajectoryRecorded":
            try:
                r = rollout_of(event, self.limits)
            except (InvalidEvent, KeyError, TypeError) as exc:
                self.outcomes["invalid"] += 1
                self.invalid.append((str(event.get("event_id")), str(exc)))
                return
            self.add_rollout(r)
        elif name == "StepCompleted":
            self.add_step(event)

    def add_rollout(self, r: Rollout, keys: list | None = None) -> str:
        """Process one rollout; `keys` are its pattern keys if already computed."""
        run_id, step, task_id = r.run_id, r.step, r.task_id
        pending = self.pending.get(run_id)
        if pending and takes_effect(pending[0][0], step):
            self._apply_steps(run_id, step)
        tkey = (run_id, task_id)
        state = self.tasks.get(tkey)
        if state is None:
            state = self.tasks[tkey] = new_task_state()
        was_open = str(step) in state["open"]
        outcome, signals = record_rollout(state, r, self.th)
        self.outcomes[outcome] += 1
        if outcome != ACCEPTED:
            return outcome
        skey = (run_id, step)
        if signals:
            self.signals += signals
            self.open_by_step.get(skey, set()).discard(task_id)
        elif not was_open:
            self.open_by_step.setdefault(skey, set()).add(task_id)
        sstate = self.steps.get(skey)
        if sstate is None:
            sstate = self.steps[skey] = new_step_state()
        if not sstate["closed"]:
            if keys is None:
                keys = pattern_keys(r.names, self.th.pattern_length)
            count_rollout(sstate, r.event_id, task_id, keys, r.evidence)
            if step_complete(sstate):
                self.signals += close_step(sstate, run_id, step, self.th, False, self.limits)
        return outcome

    def _apply_steps(self, run_id: str, below: int) -> None:
        """Apply the completed-step records of `run_id` with step < `below`, in step order."""
        pending = self.pending.get(run_id) or []
        while pending and takes_effect(pending[0][0], below):
            step, count = pending.pop(0)
            self._complete_step(run_id, step, count)

    def _complete_step(self, run_id: str, step: int, count: int | None) -> None:
        for skey in sorted(k for k in self.open_by_step if k[0] == run_id and k[1] <= step):
            for task_id in sorted(self.open_by_step.pop(skey)):
                self.signals += close_groups(self.tasks[(run_id, task_id)], step, self.th)
        sstate = self.steps.get((run_id, step))
        if sstate is None:
            sstate = self.steps[(run_id, step)] = new_step_state()
        if count is not None and not sstate["closed"]:
            set_trajectory_count(sstate, count)
            if step_complete(sstate):
                self.signals += close_step(sstate, run_id, step, self.th, False, self.limits)

    def finish(self) -> list[Signal]:
        """Apply the remaining completed-step records, then close every open group and step."""
        for run_id in sorted(self.pending):
            self._apply_steps(run_id, 2**63 - 1)
        for (run_id, task_id), state in sorted(self.tasks.items()):
            if state["open"]:
                self.signals += close_groups(state, 2**63 - 1, self.th)
        self.open_by_step.clear()
        for (run_id, step), sstate in sorted(self.steps.items()):
            if not sstate["closed"]:
                self.signals += close_step(sstate, run_id, step, self.th, not step_complete(sstate), self.limits)
        return self.signals


def replay_signals(events: Iterable[tuple[str, dict]], thresholds: Thresholds = Thresholds(),
                   limits: EvidenceLimits = EvidenceLimits()) -> list[Signal]:
    """Every signal of a log, given as (record name, event) pairs, trajectories in log order.

    Completed-step records are taken first, wherever they sit in `events`, as `coevolve replay` does
    with its files and topics."""
    replayer = Replayer(thresholds, limits)
    trajectories = []
    for name, event in events:
        if name == "StepCompleted":
            replayer.add_step(event)
        elif name == "TrajectoryRecorded":
            trajectories.append(event)
    for event in trajectories:
        replayer.add_event("TrajectoryRecorded", event)
    return replayer.finish()


def replay_files(paths: Iterable[Path | str], thresholds: Thresholds = Thresholds(),
                 limits: EvidenceLimits = EvidenceLimits(), workers: int = 1, decoder: str = "chdb",
                 evidence: bool = True) -> ReplayResult:
    """Replay Avro container files (trajectory and completed-step files, any order). `decoder`: chdb
    (ClickHouse reads the files; evidence is fetched at the end for the trajectories signals carry) or
    fastavro (in `workers` processes); the same pure functions decide every signal either way.
    `evidence=False` (chdb): skip that fetch; the signals then carry no trajectories."""
    started = time.perf_counter()
    replayer = Replayer(thresholds, limits)
    trajectory_files, step_files = split_inputs(paths)
    for event in file_steps(step_files):
        replayer.add_step(event)
    if decoder == "fastavro":
        events = _feed(replayer, fastavro_rollouts(trajectory_files, limits, thresholds.pattern_length, workers))
        signals = replayer.finish()
    else:
        import clickhouse_connect  # loads chDB: only when it decodes

        client = clickhouse_connect.get_client(dsn="chdb://memory")
        try:
            events = _feed(replayer, chdb_rollouts(client, trajectory_files, thresholds.pattern_length))
            signals = replayer.finish()
            if evidence:
                _fill_evidence(client, signals, trajectory_files, limits)
            else:
                for s in signals:
                    if s.evidence.get("trajectories"):
                        s.evidence["trajectories"] = []
        finally:
            client.close()
    return ReplayResult(signals, events, time.perf_counter() - started, dict(replayer.outcomes),
                        replayer.invalid)


def _feed(replayer: Replayer, items: Iterable[tuple]) -> int:
    events = 0
    for item in items:
        events += 1
        if item[0] == "invalid":
            replayer.outcomes["invalid"] += 1
            replayer.invalid.append((item[1], item[2]))
        else:
            replayer.add_rollout(*item)
    return events


def _fill_evidence(client, signals: list[Signal], paths: list[Path], limits: EvidenceLimits) -> None:
    """Replace the event ids standing in for trajectories in the signals' evidence with the evidence
    itself, read from the files (the first valid occurrence of each id, shaped as `rollout_of` does)."""
    lists = [s.evidence["trajectories"] for s in signals if s.evidence.get("trajectories")]
    wanted = {e for lst in lists for e in lst if isinstance(e, str)}
    if not wanted:
        return
    found = evidence_of(client, wanted, ("files", paths), limits)
    for lst in lists:
        lst[:] = [found[e] if isinstance(e, str) else e for e in lst]


def replay_topics(bootstrap: str, thresholds: Thresholds = Thresholds(),
                  limits: EvidenceLimits = EvidenceLimits()) -> ReplayResult:
    started = time.perf_counter()
    replayer = Replayer(thresholds, limits)
    events = 0
    for name, event in read_topics(bootstrap):
        events += name == "TrajectoryRecorded"
        replayer.add_event(name, event)
    signals = replayer.finish()
    return ReplayResult(signals, events, time.perf_counter() - started, dict(replayer.outcomes),
                        replayer.invalid)
