"""What the run has produced so far, read back from the broker: the source of progress and summary.

A group-less consumer reads every topic of the catalog from the beginning, so the tally counts
exactly what is on the broker, whoever published it. Redelivered events (same `event_id`) count once.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields
from typing import Any

from coevolve.services.learner.loop.record import PHASES, StepRecord
from coevolve.services.run.mechanism import Mechanism

STEP_FIELDS = tuple(f.name for f in fields(StepRecord) if f.name not in ("event_id", "run_id", "step", "produced_at"))
"""What the tally keeps of a StepCompleted event: every field of the learner's StepRecord but its identity and
production time (an event of an older schema version lacks some; they read as None)."""


@dataclass
class Tally:
    """Counts and per-step records of one run (others on the broker are counted apart)."""

    run_id: str | None = None
    seen: set[str] = field(default_factory=set)
    events: Counter = field(default_factory=Counter)
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    signals: Counter = field(default_factory=Counter)
    explorations: Counter = field(default_factory=Counter)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    signal_events: dict[str, dict[str, Any]] = field(default_factory=dict)
    exploration_events: dict[str, dict[str, Any]] = field(default_factory=dict)
    subject_scores: dict[tuple[str, int], float] = field(default_factory=dict)
    """What origin, targeting, repair and lineage read of each signal and exploration (`mechanism`)."""
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    deadletters: Counter = field(default_factory=Counter)
    # Per (task, step): scores, for the why-not of signals that did not fire.
    scores: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    actions: int = 0
    trajectories: int = 0
    other_runs: Counter = field(default_factory=Counter)
    policy_updates: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per policy version, its PolicyUpdated event (bytes, seconds, servers)."""

    def add(self, name: str, event: dict[str, Any]) -> bool:
        """Count one event; False when it was seen already or belongs to another run."""
        event_id = str(event.get("event_id"))
        if event_id in self.seen:
            return False
        run = event.get("run_id")
        if self.run_id is not None and run is not None and run != self.run_id and name != "TaskChecked":
            self.other_runs[name] += 1
            return False
        self.seen.add(event_id)
        self.events[name] += 1
        handler = getattr(self, f"_on_{name}", None)
        if handler is not None:
            handler(event)
        return True

    def _on_TrajectoryRecorded(self, e: dict) -> None:  # noqa: N802 (event names)
        self.trajectories += 1
        self.actions += len(e.get("actions") or [])
        self.scores[(str(e["task_id"]), int(e["step"]))].append(float(e["score"]))

    def _on_StepCompleted(self, e: dict) -> None:  # noqa: N802
        self.steps[int(e["step"])] = {k: e.get(k) for k in STEP_FIELDS}

    def _on_SignalRaised(self, e: dict) -> None:  # noqa: N802
        self.signals[str(e["kind"])] += 1
        self.signal_events[str(e["event_id"])] = {k: e.get(k) for k in ("kind", "step", "task_id", "subject", "pattern",
                                                                        "thresholds", "evidence")}

    def _on_ExplorationRecorded(self, e: dict) -> None:  # noqa: N802
        self.explorations[str(e.get("strategy") or "signal-guided")] += 1
        self.exploration_events[str(e["event_id"])] = {k: e.get(k) for k in ("strategy", "signal_kind", "signal_ids",
                                                                             "task_id", "step")}

    def _on_TaskChecked(self, e: dict) -> None:  # noqa: N802
        if e.get("source") == "synthesized":  # compacted topic: the latest verdict per task stands
            self.verdicts[str(e["task_id"])] = {"verdict": str(e["verdict"]), "stage": e.get("stage"),
                                                "reason": str(e.get("reason") or ""), "step": int(e["step"]),
                                                **{k: e.get(k) for k in ("exploration_ids", "signal_ids",
                                                                         "seed_task_id", "reference_solution",
                                                                         "instruction_turns", "involved_classes")}}

    @property
    def mechanism(self) -> Mechanism:
        """The run's tasks traced back to their signals (origin, targeting, repair, lineage)."""
        return Mechanism(self.exploration_events, self.signal_events, self.verdicts, self.scores, self.subject_scores)

    def _on_EvaluationCompleted(self, e: dict) -> None:  # noqa: N802
        if e.get("split") == "subjects":  # the signals' subjects (learner.eval_subjects): repair, not held-out
            for task_id, score in zip(e.get("task_ids") or (), e.get("scores") or ()):
                self.subject_scores[(str(task_id), int(e["step"]))] = float(score)
            return
        self.evaluations.append({k: e.get(k) for k in ("step", "split", "task_count", "success_rate", "mean_score",
                                                       "policy_version", "duration_seconds", "task_ids", "scores")})

    def _on_PolicyUpdated(self, e: dict) -> None:  # noqa: N802
        self.policy_updates[int(e["version"])] = {k: e.get(k) for k in ("step", "bytes", "seconds", "servers",
                                                                         "servers_behind")}

    def _on_DeadLettered(self, e: dict) -> None:  # noqa: N802
        self.deadletters[f"{e.get('service')}: {e.get('error_type')}"] += 1

    @property
    def validated(self) -> int:
        return sum(v["verdict"] == "validated" for v in self.verdicts.values())

    @property
    def last_step(self) -> int:
        return max(self.steps, default=0)

    @property
    def synthesized_trained(self) -> int:
        """Rollouts of synthesized tasks the run's updates trained on."""
        return sum(s.get("synthesized_trained") or 0 for s in self.steps.values())

    @property
    def first_synthesized_step(self) -> int | None:
        """The first step whose update trained on a synthesized task: where the loop closed."""
        return min((k for k, s in self.steps.items() if s.get("synthesized_trained")), default=None)

    @property
    def policy_lag(self) -> dict[str, float | None]:
        """How far behind the policy being updated the rollouts trained on were, in versions: the largest
        lag of any step, the mean of the steps' mean lags, and the groups left out for exceeding the bound."""
        lags = [s for s in self.steps.values() if s.get("staleness_max") is not None]
        return {"max": max((s["staleness_max"] for s in lags), default=None),
                "mean": sum(s["staleness_mean"] for s in lags) / len(lags) if lags else None,
                "stale_groups": sum(s.get("stale_groups") or 0 for s in self.steps.values())}

    @property
    def weight_updates(self) -> dict[str, Any]:
        """How many pushes the rollout engine took, and their median seconds and bytes."""
        seconds = sorted(u["seconds"] for u in self.policy_updates.values())
        middle = len(seconds) // 2
        median = None if not seconds else seconds[middle] if len(seconds) % 2 else \
            (seconds[middle - 1] + seconds[middle]) / 2
        return {"count": len(seconds), "median_seconds": median,
                "bytes": max((u["bytes"] for u in self.policy_updates.values()), default=None),
                "servers_behind": max((u["servers_behind"] or 0 for u in self.policy_updates.values()),
                                      default=0)}

    def synthesized_line(self, step: int) -> str | None:
        """The terminal's note that a step trained on tasks the loop made, and where they came from, or None."""
        s = self.steps[step]
        rollouts, tasks = s.get("synthesized_trained") or 0, s.get("synthesized_tasks_trained") or 0
        if not rollouts:
            return None
        mechanism = self.mechanism
        trained = sorted(t for t in mechanism.validated if step in mechanism.trained_steps(t))
        origins = sorted({mechanism.describe(t) for t in trained})
        return (f"step {step}: trained on {tasks} synthesized task{'s' if tasks != 1 else ''} "
                f"({rollouts} rollout{'s' if rollouts != 1 else ''})" + (f", {'; '.join(origins)}" if origins else ""))

    def progress_line(self, step: int, total: int) -> str:
        """One terminal line for a completed step."""
        s = self.steps[step]
        reward = "-" if s.get("train_reward") is None else f"{s['train_reward']:.3f}"
        loss = "-" if s.get("loss") is None else f"{s['loss']:+.4f}"
        signals = " · ".join(f"{k} {self.signals.get(k, 0)}" for k in ("forgetting", "boundary", "rare"))
        explored = " · ".join(f"{n} {k}" for k, n in sorted(self.explorations.items())) or "0"
        rejected = len(self.verdicts) - self.validated
        pool = s.get("pool_size")
        pool_text = "-" if pool is None else f"{pool} ({s.get('pool_synthesized') or 0} synthesized)"
        times = ", ".join(f"{k} {s[f'{k}_seconds']:.1f} s" for k in PHASES[:3] if s.get(f"{k}_seconds") is not None)
        return (f"step {step}/{total}  rollouts {s.get('trajectory_count')}  reward {reward}  loss {loss}  "
                f"signals {signals}  explorations {explored}  verdicts {self.validated} validated · {rejected} "
                f"rejected  pool {pool_text}  ({times})")
