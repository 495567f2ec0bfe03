"""The rare agent's batch as plain data: per-step counts from the attempt agents, trajectory counts
from completed steps, and the grace period, with the rules of streams/rules.py. No Faust import.

Table step_to_counts["run_id\\x1fstep"] = a `rules.StepState` plus "p" (partition), "run_id", "step"
and "touched" (when its last message came). A step closes when its trajectory_count trajectories are
counted, or `grace_s` after its last message, flagged incomplete (checked at each tick, over an index
of the partition's open steps rebuilt from the table every `index_rebuild_s`).
"""
from __future__ import annotations

from coevolve.streams import rules
from coevolve.streams.rules import EvidenceLimits, Signal, Thresholds
from coevolve.streams.worker.attempts import step_key


class RareBatch:
    """One batch of `raise_rare_signals`. `table` is step_to_counts (read with get/items); `open_steps`
    (partition -> keys of its steps not closed) and `indexed_at` (partition -> when that index was
    rebuilt) live as long as the agent."""

    def __init__(self, th: Thresholds, limits: EvidenceLimits, now: float, grace_s: float, index_rebuild_s: float,
                 table, open_steps: dict[int, set[str]], indexed_at: dict[int, float]):
        self.th, self.limits, self.now, self.grace_s = th, limits, now, grace_s
        self.index_rebuild_s = index_rebuild_s
        self.table, self.open_steps, self.indexed_at = table, open_steps, indexed_at
        self.writes: dict[str, tuple] = {}  # key -> (token, state)
        self.raised: list[Signal] = []
        self.closed = {"closed_by_count": 0, "closed_by_grace": 0}  # steps this batch closed, by how

    def tick(self, p: int, token) -> None:
        """Close the partition's open steps whose grace period has passed."""
        if self.now - self.indexed_at.get(p, 0.0) >= self.index_rebuild_s:
            states = list(self.table.items()) + [(k, v) for k, (_t, v) in self.writes.items()]
            self.open_steps[p] = {k for k, v in states if v["p"] == p and not v["closed"]}
            self.indexed_at[p] = self.now
        for key in sorted(self.open_steps[p]):
            state = self._get(key)
            if state is None or state["closed"]:
                self.open_steps[p].discard(key)
            elif self.now - state["touched"] > self.grace_s:
                self.writes[key] = (token, state)
                self.raised.extend(rules.close_step(state, state["run_id"], state["step"], self.th, True, self.limits))
                self.open_steps[p].discard(key)
                self.closed["closed_by_grace"] += 1

    def add(self, p: int, token, body: dict) -> None:
        """Count a step's message: its trajectory count ("completed") or pattern keys ("counts")."""
        run_id, step = body["run_id"], body["step"]
        key = step_key(run_id, step)
        state = self._get(key)
        if state is None:
            state = {**rules.new_step_state(), "p": p, "run_id": run_id, "step": step}
        self.writes[key] = (token, state)
        if state["closed"]:
            return
        state["touched"] = self.now
        if body["kind"] == "completed":
            rules.set_trajectory_count(state, body["count"])
        else:
            evidence = body["evidence"]
            for event_id, task_id, keys in body["items"]:
                rules.count_rollout(state, event_id, task_id, keys, evidence.get(event_id))
        if rules.step_complete(state):
            self.raised.extend(rules.close_step(state, run_id, step, self.th, False, self.limits))
            self.open_steps[p].discard(key)
            self.closed["closed_by_count"] += 1
        else:
            self.open_steps[p].add(key)

    def _get(self, key: str):
        return self.writes[key][1] if key in self.writes else self.table.get(key)
