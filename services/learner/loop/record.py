"""What the learner publishes of a step: `StepRecord`, the `StepCompleted` event as a type, and the
phases a step's time is split into. Free of torch, so the run's tally and the report read it cheaply."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    """One step as the `StepCompleted` event tells it (schemas/StepCompleted.avsc, field for field, in its
    order); built once at the end of the step, then given its evaluation score and its publish time."""

    event_id: str
    run_id: str
    step: int
    trajectory_count: int
    """Trajectories the step published (every rollout, flat groups included)."""
    policy_version: int
    """The rollout backend's policy version after the step (+1 when it pushed an update)."""
    train_reward: float
    """Mean reward of the step's rollouts."""
    eval_success: float | None
    """Held-out success rate, when the step ended with an evaluation."""
    loss: float | None
    """The update's loss; None when the step took no update."""
    duration_seconds: float
    """The step's wall time: the blocked time before it, the step itself and its publishing."""
    pool_size: int
    pool_synthesized: int
    zero_variance_groups: int
    resampled_groups: int
    tokens_trained: int
    synthesized_trained: int
    """Rollouts of synthesized tasks whose group gave the update a gradient; 0 without an update."""
    synthesized_tasks_trained: int
    staleness_max: int | None
    """Versions between the update and the oldest policy behind a rollout it trained on; None without one."""
    staleness_mean: float | None
    stale_groups: int
    """Groups left out of the update for a rollout older than `max_policy_lag` versions (a lagging server)."""
    rollout_seconds: float
    scoring_seconds: float
    training_seconds: float
    push_seconds: float
    publish_seconds: float | None
    """None until the service has published the step's trajectories (`published`)."""
    blocked_seconds: float
    produced_at: int

    def evaluated(self, score: float) -> StepRecord:
        """This record with the evaluation the step ended with."""
        return dataclasses.replace(self, eval_success=score)

    def published(self, seconds: float) -> StepRecord:
        """This record with its publish time, which also counts in the step's duration."""
        return dataclasses.replace(self, publish_seconds=seconds, duration_seconds=self.duration_seconds + seconds)

    def to_event(self) -> dict[str, Any]:
        """The `StepCompleted` event (and the journal's record): every field, in the schema's order."""
        return dataclasses.asdict(self)

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> StepRecord:
        return cls(**event)


PHASES = tuple(f.name.removesuffix("_seconds") for f in dataclasses.fields(StepRecord)
               if f.name.endswith("_seconds") and f.name != "duration_seconds")
"""The parts a step's time is split into, each a `<phase>_seconds` field: rollout, scoring, training,
push (timed by the step), publish and blocked (by the service)."""
