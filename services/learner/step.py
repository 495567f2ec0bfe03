"""One GRPO training step, top to bottom: sample, roll out, score, advantages, sequences, update, push,
and the records the service publishes.

    drawn    = pool.draw(B)                                    # sample: the pool changed only before this step
    episodes = run_episodes(K copies of each task, backend)    # roll out: batched multi-turn rollouts
    rewards  = success (binary) or fraction of turns passed (partial)               # score
    dynamic sampling: groups with equal rewards are replaced by new draws, up to max_resample rounds
    A_i      = (r_i - mean_group) / (std_group + eps)          # advantages: grpo.group_advantages
    batch    = one TrainSequence per rollout, with its A_i     # sequences
    engine.update(batch)                                       # update: clipped ratio against rollout log-probs
    backend.update_weights(policy, version + 1)                # push: the next rollouts use the new policy
    trajectories, StepRecord                                   # publish: what the service sends

Every rollout of the step (dropped flat groups included) becomes a `TrajectoryRecorded` record, and
the step a `StepRecord` (the `StepCompleted` event); publishing them is the service's job, after the
step is complete, so nothing of an abandoned step reaches the broker. The result also carries the
exact batch the update trained on, which the service journals so that a resumed learner replays the
update instead of re-running the step (journal.py). A drawn task whose episode cannot start is dropped
from the pool and replaced by another draw (`TaskPool.draw`), so no episode meets an `InvalidTask`.
Rollout log-probs are those of the tempered sampling distribution (the backends report them so), the
same quantity `grpo.token_logprobs` computes with `GRPOConfig.temperature`, which is also the rollout
temperature: the ratio is 1 before an update. `scoring_seconds` covers rewards and advantages; the
environment's own turn checks run inside the episodes and count as rollout time.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import Episode, run_episodes
from coevolve.services.learner.batch import TrainSequence
from coevolve.services.learner.config import GRPOConfig, LearnerConfig
from coevolve.services.learner.grpo import group_advantages
from coevolve.services.learner.record import StepRecord
from coevolve.services.learner.sampler import Drawn, TaskPool

Reward = Callable[[Episode], float]


def reward_function(name: str) -> Reward:
    """`binary`: 1 for a solved task, else 0 (the paper's); `partial`: the share of turns passed."""
    if name == "binary":
        return lambda episode: float(episode.success)
    if name == "partial":
        return lambda episode: float(episode.score)
    raise ValueError(f"unknown reward {name!r}; use binary or partial")


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


@dataclass(frozen=True)
class Update:
    """The engine's update over a step's batch, and the push that followed it."""

    metrics: dict[str, float]
    """The engine's metrics of the update; empty when there was none."""
    trained: bool
    """Whether the update (and the push) happened: not when no advantage was non-zero."""


@dataclass(frozen=True)
class StepResult:
    """What a finished step publishes (its trajectories, then its record) and the batch it trained on."""

    trajectories: list[dict[str, Any]]
    record: StepRecord
    update: Update
    batch: list[TrainSequence] = field(default_factory=list)
    """The sequences the update trained on; empty when the step did not train."""

    @property
    def trained(self) -> bool:
        return self.update.trained


def step_event_id(run_id: str, step: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"coevolve:{run_id}:step:{step}"))


class StepRunner:
    """Holds the pool, rollout backend and training engine; `run(step)` does one GRPO step."""

    def __init__(self, cfg: LearnerConfig, grpo: GRPOConfig, pool: TaskPool, backend: Any, engine: Any,
                 sampling: SamplingConfig, limits: EpisodeLimits, run_id: str, reward: Reward | None = None,
                 env: str | Callable[[], Any] = "bfcl"):
        self.cfg, self.grpo, self.pool, self.backend, self.engine = cfg, grpo, pool, backend, engine
        self.env = env
        self.sampling, self.limits, self.run_id = sampling, limits, run_id
        self.reward = reward or reward_function(grpo.reward)
        self.times = PhaseTimes()
        self.should_stop: Callable[[], bool] | None = None  # the service's stop flag: abandon the rollouts

    def run(self, step: int, blocked_seconds: float = 0.0) -> StepResult:
        """One whole step; `blocked_seconds` is what the pool's refresh before it took."""
        started = time.perf_counter()
        self.times = PhaseTimes()
        rollouts = self.gather()  # sample, roll out, score
        with self.times.phase("scoring"):
            batch = self.sequences(rollouts.kept)  # advantages, sequences
        update = self.update_and_push(batch)  # update, push
        trajectories = self.trajectories(step, rollouts.groups)  # publish: what the service sends
        record = self.record(step, rollouts, update, len(trajectories), started, blocked_seconds)
        return StepResult(trajectories, record, update, batch if update.trained else [])

    def gather(self) -> Rollouts:
        """Roll out B drawn tasks, scored; with dynamic sampling, redraw to replace the flat groups."""
        groups = self.roll_out(self.pool.draw(self.cfg.batch_tasks))
        if not self.cfg.dynamic_sampling:
            return Rollouts(groups, groups, 0)
        kept = [g for g in groups if not g.flat]
        resampled = 0
        for _ in range(self.cfg.max_resample):
            missing = self.cfg.batch_tasks - len(kept)
            if missing <= 0:
                break
            fresh = self.roll_out(self.pool.draw(missing))
            resampled += len(fresh)
            groups += fresh
            kept += [g for g in fresh if not g.flat]
        return Rollouts(groups, kept[:self.cfg.batch_tasks], resampled)

    def roll_out(self, drawn: Sequence[Drawn]) -> list[Group]:
        """K rollouts of every drawn task in one batched run, scored."""
        k = self.cfg.group_size
        tasks = [d.task for d in drawn for _ in range(k)]
        with self.times.phase("rollout"):
            episodes = run_episodes(tasks, self.env, self.backend, self.sampling, self.limits,
                                    max_in_flight=self.cfg.in_flight, should_stop=self.should_stop)
        groups = [Group(d, episodes[i * k:(i + 1) * k]) for i, d in enumerate(drawn)]
        with self.times.phase("scoring"):
            for group in groups:
                group.rewards = [self.reward(e) for e in group.episodes]
        return groups

    def sequences(self, groups: Sequence[Group]) -> list[TrainSequence]:
        """One TrainSequence per rollout, with its group-relative advantage."""
        if not groups:
            return []
        rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float64)
        ids = torch.arange(len(groups)).repeat_interleave(self.cfg.group_size)
        advantages, _ = group_advantages(rewards, ids, self.grpo.adv_eps)
        episodes = [e for g in groups for e in g.episodes]
        return [TrainSequence.from_episode(e, float(a)) for e, a in zip(episodes, advantages)]

    def update_and_push(self, batch: list[TrainSequence]) -> Update:
        """Update the policy and load it into the rollout backend; neither when no advantage is non-zero."""
        if not any(s.advantage != 0.0 and s.loss_tokens for s in batch):
            return Update({}, False)
        with self.times.phase("training"):
            metrics = self.engine.update(batch)
        with self.times.phase("push"):
            self.backend.update_weights(self.engine.named_parameters(), version=self.backend.version + 1)
        return Update(metrics, True)

    def trajectories(self, step: int, groups: Sequence[Group]) -> list[dict[str, Any]]:
        """Every rollout as a TrajectoryRecorded record; a task drawn twice keeps distinct rollout indices."""
        seen: dict[str, int] = {}
        out = []
        for group in groups:
            task_id = group.drawn.task.task_id
            base = seen.get(task_id, 0)
            seen[task_id] = base + len(group.episodes)
            for i, episode in enumerate(group.episodes):
                out.append(episode.to_trajectory_event(self.run_id, step, base + i, self.cfg.group_size,
                                                       task_source=group.drawn.source))
        return out

    def record(self, step: int, rollouts: Rollouts, update: Update, trajectory_count: int, started: float,
               blocked_seconds: float) -> StepRecord:
        """The step's record, before its evaluation and publishing (`started`: the step's perf_counter start)."""
        rewards = [r for g in rollouts.groups for r in g.rewards]
        synthesized = [g for g in rollouts.kept if g.drawn.source == "synthesized" and not g.flat] \
            if update.trained else []
        return StepRecord(
            event_id=step_event_id(self.run_id, step), run_id=self.run_id, step=step,
            trajectory_count=trajectory_count, policy_version=self.backend.version,
            train_reward=sum(rewards) / len(rewards), eval_score=None, loss=update.metrics.get("loss"),
            duration_seconds=time.perf_counter() - started + blocked_seconds,
            pool_size=self.pool.size, pool_synthesized=len(self.pool.synthesized),
            zero_variance_groups=sum(g.flat for g in rollouts.groups), resampled_groups=rollouts.resampled,
            tokens_trained=int(update.metrics.get("loss_tokens", 0)) if update.trained else 0,
            synthesized_trained=sum(len(g.episodes) for g in synthesized),
            synthesized_tasks_trained=len({g.drawn.task.task_id for g in synthesized}),
            rollout_seconds=self.times.rollout, scoring_seconds=self.times.scoring,
            training_seconds=self.times.training, push_seconds=self.times.push, publish_seconds=None,
            blocked_seconds=blocked_seconds, produced_at=int(time.time() * 1000))
