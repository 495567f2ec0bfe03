"""What a GRPO step passes from phase to phase (step.py): the time each phase took, the groups of rollouts
and their rewards, the update and its push, and the finished step's result.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from coevolve.services.agent.episodes import Episode
from coevolve.services.agent.generation import Push
from coevolve.services.learner.loop.record import StepRecord
from coevolve.services.learner.loop.sampler import Drawn
from coevolve.services.learner.trainer.batch import TrainSequence


@dataclass
class PhaseTimes:
    """Seconds spent so far in each phase the step times itself; `with times.phase("rollout"): ...`."""

    rollout: float = 0.0
    scoring: float = 0.0
    training: float = 0.0
    push: float = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time the block takes to phase `name` (an exception's too)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, name, getattr(self, name) + time.perf_counter() - started)


@dataclass
class Group:
    """The K rollouts of one drawn task and their rewards."""

    drawn: Drawn
    episodes: list[Episode]
    rewards: list[float] = field(default_factory=list)

    @property
    def flat(self) -> bool:
        return max(self.rewards) == min(self.rewards)


@dataclass(frozen=True)
class Rollouts:
    """What a step rolled out and scored."""

    groups: list[Group]
    """Every group, in the order drawn: all of them are published."""
    kept: list[Group]
    """The groups the update trains on (without dynamic sampling, all of them)."""
    resampled: int
    """Groups drawn again to replace flat ones (dynamic sampling)."""
    times: PhaseTimes = field(default_factory=PhaseTimes)
    """Rollout and scoring seconds of the job that made them."""
    blocked: float = 0.0
    """Seconds taking the pool's arrivals in before the draws."""


@dataclass(frozen=True)
class Update:
    """The trainer's update over a step's batch, and the push that followed it."""

    metrics: dict[str, float]
    """The trainer's metrics of the update; empty when there was none."""
    trained: bool
    """Whether the update (and the push) happened: not when no advantage was non-zero."""
    push: Push | None = None
    """What the push that followed the update did; None without one."""


@dataclass(frozen=True)
class StepOutcome:
    """What a finished step publishes (its trajectories, then its record) and the batch it trained on."""

    trajectories: list[dict[str, Any]]
    record: StepRecord
    update: Update
    batch: list[TrainSequence] = field(default_factory=list)
    """The sequences the update trained on; empty when the step did not train."""
    pool_state: dict[str, Any] | None = None
    """The pool as a resume continues from it: after this step's draws, before any later step's."""
    policy_update: dict[str, Any] | None = None
    """The `PolicyUpdated` record of the step's push; None without one."""

    @property
    def trained(self) -> bool:
        return self.update.trained


def staleness(groups: Sequence[Group], version: int) -> list[int]:
    """Per rollout, the versions between `version` (the policy being updated) and the one it came from."""
    return [version - e.policy_version for g in groups for e in g.episodes]
