"""The attempt agent's batch as plain data: completed-step markers, rollouts and the idle rule, with the
rules of streams/rules.py. No Faust import.

The agent hands each message to an `AttemptBatch` (`seen`, then `add_marker` or `add_rollout`), calls
`close_idle()`, sends `raised`, `count_messages()` and its dead letters, and then writes `writes` to
table `task_to_attempts` and `marker_writes()` to `partition_to_markers`. A `token` is what the agent
needs to write a key of that partition (Faust: an event of it); it is carried, never read.

Table values: task_to_attempts[task_id] = {"p": partition, "runs": {run_id: TaskState}};
partition_to_markers[str(p)] = [{"kind": "completed", "run_id", "step", "arrived"}, ...], the markers
not yet applied. A marker takes effect just before the partition's first trajectory of its run with a
higher step (`rules.takes_effect`), or once the partition has been idle `marker_idle_s`.
"""
from __future__ import annotations

import json
from collections import defaultdict

from coevolve.streams import rules
from coevolve.streams.rules import EvidenceLimits, Rollout, Signal, Thresholds


def step_key(run_id: str, step: int) -> str:
    """The key of a (run, step) in the step-counts topic and table `step_to_counts`."""
    return f"{run_id}{rules.SEP}{step}"


class AttemptBatch:
    """One batch of `raise_attempt_signals`. `tasks` and `markers` are the tables (read with get/items);
    `last_seen` (partition -> when its last trajectory came) and `candidates` ((run, step) -> pattern ->
    smallest event ids sent) live as long as the agent."""

    def __init__(self, th: Thresholds, limits: EvidenceLimits, now: float, marker_idle_s: float,
                 tasks, markers, last_seen: dict[int, float], candidates: dict[tuple, dict]):
        self.th, self.limits, self.now, self.marker_idle_s = th, limits, now, marker_idle_s
        self.tasks, self.markers = tasks, markers
        self.last_seen, self.candidates = last_seen, candidates
        self.writes: dict[str, tuple] = {}  # task_id -> (token, value)
        self.pending: dict[int, list[dict]] = {}  # partition -> markers not yet applied (the table, read once)
        self.raised: list[Signal] = []
        self.outcomes: dict[str, int] = defaultdict(int)
        self.contributions: dict[tuple, list[Rollout]] = defaultdict(list)
        self.last_token: dict[int, object] = {}

    def seen(self, p: int, token, trajectory: bool) -> None:
        """Note a message of partition `p` (a trajectory, valid or not, or a marker): its table writes
        may go under `token`, and a trajectory ends the partition's idle time. The idle time starts when
        this agent first sees the partition: a worker that takes a partition over (markers pending in
        its table, its trajectories still to be read again from the committed offset) waits as long as
        a running one before markers close groups."""
        self.last_token[p] = token
        if trajectory or p not in self.last_seen:
            self.last_seen[p] = self.now

    def add_marker(self, p: int, marker: dict) -> None:
        if marker.get("kind") != "tick":
            self._pending_of(p).append({**marker, "arrived": self.now})

    def add_rollout(self, p: int, token, r: Rollout) -> str:
        """Apply the markers the rollout makes due, then record it; return its outcome."""
        if self._pending_of(p):
            due = [m for m in self.pending[p] if m["run_id"] == r.run_id and rules.takes_effect(m["step"], r.step)]
            if due:
                self._apply(p, token, due)
        tstate = self._state_of(r.task_id, p, token)["runs"].setdefault(r.run_id, rules.new_task_state())
        outcome, found = rules.record_rollout(tstate, r, self.th)
        self.outcomes[outcome] += 1
        if outcome == rules.ACCEPTED:
            self.raised.extend(found)
            self.contributions[(r.run_id, r.step)].append(r)
        return outcome

    def close_idle(self) -> None:
        """Apply the markers of every partition idle `marker_idle_s` that have waited as long."""
        idle_s = self.marker_idle_s
        for p, token in self.last_token.items():
            if self.now - self.last_seen[p] < idle_s:
                continue
            due = [m for m in self._pending_of(p) if self.now - m["arrived"] >= idle_s]
            if due:
                self._apply(p, token, due)

    def count_messages(self) -> list[tuple[str, bytes]]:
        """Per (run, step) touched, the pattern keys of its accepted rollouts for the rare agent (keyed
        by step: the repartition), with the evidence of those that may be among the smallest ids."""
        out = []
        keep = self.limits.rare_trajectories
        for (run_id, step), rollouts in self.contributions.items():
            best = self.candidates.setdefault((run_id, step), {})
            items, evidence = [], {}
            for r in rollouts:
                keys = rules.pattern_keys(r.names, self.th.pattern_length)
                items.append([r.event_id, r.task_id, keys])
                if rules.offer_candidate(best, r.event_id, keys, keep):
                    evidence[r.event_id] = r.evidence
            body = json.dumps({"kind": "counts", "run_id": run_id, "step": step, "items": items,
                               "evidence": evidence}, separators=(",", ":")).encode()
            out.append((step_key(run_id, step), body))
        return out

    def marker_writes(self) -> dict[str, tuple]:
        """The partitions whose pending markers changed: str(p) -> (token, markers)."""
        return {str(p): (self.last_token[p], markers) for p, markers in self.pending.items()
                if markers != (self.markers.get(str(p)) or [])}

    def _pending_of(self, p: int) -> list[dict]:
        if p not in self.pending:
            self.pending[p] = list(self.markers.get(str(p)) or [])
        return self.pending[p]

    def _state_of(self, task_id: str, p: int, token) -> dict:
        """The task's table value, read once per batch; its write goes under the latest `token`."""
        if task_id not in self.writes:
            self.writes[task_id] = (token, self.tasks.get(task_id) or {"p": p, "runs": {}})
        else:
            self.writes[task_id] = (token, self.writes[task_id][1])
        return self.writes[task_id][1]

    def _apply(self, p: int, token, due: list[dict]) -> None:
        """Completed steps take effect in partition `p`: close every group of its tasks at or below them."""
        self.pending[p] = [m for m in self.pending[p] if m not in due]
        for m in due:
            for key in [k for k in self.candidates if k[0] == m["run_id"] and k[1] <= m["step"]]:
                del self.candidates[key]
        local = {k: v for k, v in self.tasks.items() if v.get("p") == p}
        local.update({k: v for k, (_t, v) in self.writes.items() if v.get("p") == p})
        for m in sorted(due, key=lambda m: m["step"]):
            for task_id in sorted(local):
                tstate = local[task_id]["runs"].get(m["run_id"])
                if tstate and rules.closes_any(tstate, m["step"]):
                    state = self._state_of(task_id, p, token)["runs"][m["run_id"]]
                    self.raised.extend(rules.close_groups(state, m["step"], self.th))
