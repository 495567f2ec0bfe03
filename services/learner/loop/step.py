"""One GRPO training step, top to bottom: sample, roll out, score, advantages, sequences, update, push,
and the records the service publishes.

    drawn    = pool.draw(B)                                    # sample: the pool changed only before this step
    episodes = run_episodes(K copies of each task, backend)    # roll out: batched multi-turn rollouts
    rewards  = success (binary) or fraction of turns passed (partial)               # score
    dynamic sampling: groups with equal rewards are replaced by draws of other tasks, up to max_resample rounds
    A_i      = (r_i - mean_group) / (std_group + eps)          # advantages: grpo.group_advantages
    batch    = one TrainSequence per rollout, with its A_i     # sequences
    trainer.update(batch)                                      # update: clipped ratio against rollout log-probs
    backend.update_weights(policy, version + 1)                # push: the next rollouts use the new policy
    trajectories, StepRecord                                   # publish: what the service sends

Every rollout of the step (dropped flat groups included) becomes a `TrajectoryRecorded` record, and
the step a `StepRecord` (the `StepCompleted` event), and the push a `PolicyUpdated` record; publishing
them is the service's job, after the
step is complete, so nothing of an abandoned step reaches the broker. The result also carries the
exact batch the update trained on, which the service journals so that a resumed learner replays the
update instead of re-running the step (journal.py). A drawn task whose episode cannot start is dropped
from the pool and replaced by another draw (`TaskPool.draw`), so no episode meets an `InvalidTask`.
Rollout log-probs are those of the tempered sampling distribution (the backends report them so), the
same quantity `grpo.token_logprobs` computes with `GRPOConfig.temperature`, which is also the rollout
temperature: the ratio is 1 before an update. `scoring_seconds` covers rewards and advantages; the
environment's own turn checks run inside the episodes and count as rollout time.

Bounded staleness (`max_policy_lag` L >= 1). Once step s has its rollouts, the rollouts of steps
s+1..s+L start in one background thread (`look_ahead`), in order, while s trains and pushes. Between
the moment a step's rollouts start and the update that trains on them there are at most L updates
(one per step), so no rollout is more than L versions behind: the bound is kept by how far generation
runs ahead, and no group is dropped for being slow. A rollout from an older policy than that (a fleet
server a failed transfer left behind) leaves its group out of the update (`stale_groups`), published
all the same. The step's `rollout_seconds` is then the time it waited for its rollouts. Each job takes
the pool's arrivals (`refresh`) and draws, under the pool's `guard`; the pool's state before the next job's
draws is what the step journals, so a resumed run redraws what a stop abandoned, and trains on nothing twice.
"""
from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import Episode, run_episodes
from coevolve.services.agent.generation import Backend
from coevolve.services.learner.config import GRPOConfig, LearnerConfig
from coevolve.services.learner.loop.record import StepRecord
from coevolve.services.learner.loop.results import Group, PhaseTimes, Rollouts, StepOutcome, Update, staleness
from coevolve.services.learner.loop.sampler import Drawn, TaskPool
from coevolve.services.learner.ranks.driver import Training
from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.trainer.grpo import group_advantages
from coevolve.services.learner.trainer.trainer import PolicyWeights

Reward = Callable[[Episode], float]


def tool_overlap(episode: Episode) -> float:
    """Over the user turns the episode was given, the mean overlap of the tool names it called with the
    reference's: |made & reference| / max(|made|, |reference|) as multisets, 1 where both are empty."""
    reference = episode.task.reference
    overlaps = []
    for turn in range(episode.turns):
        made = Counter(call.split("(", 1)[0] for call in (episode.calls[turn] if turn < len(episode.calls) else ()))
        wanted = Counter(call.split("(", 1)[0] for call in (reference[turn] if turn < len(reference) else ()))
        largest = max(sum(made.values()), sum(wanted.values()))
        overlaps.append(sum((made & wanted).values()) / largest if largest else 1.0)
    return sum(overlaps) / len(overlaps) if overlaps else 0.0


def reward_function(name: str) -> Reward:
    """`binary`: 1 for a solved task, else 0 (the paper's); `partial`: the share of turns passed; `shaped`:
    three quarters the share of turns passed, one quarter `tool_overlap` (a small model that seldom passes
    a turn still gets groups that score unlike when some of its rollouts pick the right tools)."""
    if name == "binary":
        return lambda episode: float(episode.success)
    if name == "partial":
        return lambda episode: float(episode.score)
    if name == "shaped":
        return lambda episode: 0.75 * float(episode.score) + 0.25 * tool_overlap(episode)
    raise ValueError(f"unknown reward {name!r}; use binary, partial or shaped")


def step_event_id(run_id: str, step: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"coevolve:{run_id}:step:{step}"))


def policy_event_id(run_id: str, version: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"coevolve:{run_id}:policy:{version}"))


class StepRunner:
    """Holds the pool, rollout backend and trainer; `run(step)` does one GRPO step."""

    def __init__(self, cfg: LearnerConfig, grpo: GRPOConfig, pool: TaskPool, backend: Backend, trainer: Training,
                 sampling: SamplingConfig, limits: EpisodeLimits, run_id: str, reward: Reward | None = None,
                 env: str | Callable[[], Any] = "bfcl"):
        self.cfg, self.grpo, self.pool, self.backend, self.trainer = cfg, grpo, pool, backend, trainer
        self.env = env
        self.sampling, self.limits, self.run_id = sampling, limits, run_id
        self.reward = reward or reward_function(grpo.reward)
        self.times = PhaseTimes()
        self.should_stop: Callable[[], bool] | None = None  # the service's stop flag: abandon the rollouts
        self._ahead: dict[int, Future] = {}
        self._before: dict[int, dict[str, Any]] = {}  # step -> the pool's state before its draws
        self._executor: ThreadPoolExecutor | None = None

    def run(self, step: int) -> StepOutcome:
        """One whole step (the pool's refresh before it included)."""
        started = time.perf_counter()
        self.times = PhaseTimes()
        rollouts = self.rollouts(step)  # sample, roll out, score: now, or taken from the look-ahead
        self.look_ahead(step)
        with self.times.phase("scoring"):
            trainable, stale = self.within_lag(rollouts.kept)
            batch = self.sequences(trainable)  # advantages, sequences
        lags = staleness(trainable, self.backend.version)
        update = self.update_and_push(batch)  # update, push
        trajectories = self.trajectories(step, rollouts.groups)  # publish: what the service sends
        record = self.record(step, rollouts, trainable, update, len(trajectories), started, lags, stale)
        with self.pool.guard:
            pool_state = self._before.get(step + 1) or self.pool.state()
            for done in [k for k in self._before if k <= step + 1]:
                del self._before[done]
        policy = self.policy_record(step, update)
        return StepOutcome(trajectories, record, update, batch if update.trained else [], pool_state, policy)

    def rollouts(self, step: int) -> Rollouts:
        """The step's rollouts: those the look-ahead started, or rolled out now."""
        ahead = self._ahead.pop(step, None)
        if ahead is None:
            rollouts = self.gather(step)
            self.times.rollout, self.times.scoring = rollouts.times.rollout, rollouts.times.scoring
            return rollouts
        with self.times.phase("rollout"):  # what the step waited; the rest overlapped the previous steps
            return ahead.result()

    def look_ahead(self, step: int) -> None:
        """Start the rollouts of steps step+1..step+L in the background (none when L = 0)."""
        lag = self.grpo.max_policy_lag
        if not lag:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts-ahead")
        for ahead in range(step + 1, min(step + lag, self.cfg.steps) + 1):
            if ahead not in self._ahead:
                self._ahead[ahead] = self._executor.submit(self.gather, ahead)

    def close(self) -> None:
        """Abandon the look-ahead: its rollouts were never trained on; a resume redraws them."""
        for future in self._ahead.values():
            future.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._ahead.clear()

    def gather(self, step: int) -> Rollouts:
        """Take the pool's arrivals, roll out B drawn tasks, scored; with dynamic sampling, redraw to
        replace the flat groups."""
        times = PhaseTimes()
        with self.pool.guard:
            blocked = self.pool.refresh(step)
            self._before[step] = self.pool.state()
            drawn = self.pool.draw(self.cfg.batch_tasks)
        groups = self.roll_out(drawn, times)
        if not self.cfg.dynamic_sampling:
            return Rollouts(groups, groups, 0, times, blocked)
        kept = [g for g in groups if not g.flat]
        resampled = 0
        for _ in range(self.cfg.max_resample):
            missing = self.cfg.batch_tasks - len(kept)
            if missing <= 0:
                break
            with self.pool.guard:  # one group per task and step: the signal processors' attempt
                redrawn = self.pool.draw(missing, exclude=frozenset(g.drawn.task.task_id for g in groups))
            if not redrawn:  # every task of the pool was rolled out in this step
                break
            fresh = self.roll_out(redrawn, times)
            resampled += len(fresh)
            groups += fresh
            kept += [g for g in fresh if not g.flat]
        return Rollouts(groups, kept[:self.cfg.batch_tasks], resampled, times, blocked)

    def roll_out(self, drawn: Sequence[Drawn], times: PhaseTimes) -> list[Group]:
        """K rollouts of every drawn task in one batched run, scored."""
        k = self.cfg.group_size
        tasks = [d.task for d in drawn for _ in range(k)]
        with times.phase("rollout"):
            episodes = run_episodes(tasks, self.env, self.backend, self.sampling, self.limits,
                                    max_in_flight=self.cfg.in_flight, should_stop=self.should_stop)
        groups = [Group(d, episodes[i * k:(i + 1) * k]) for i, d in enumerate(drawn)]
        with times.phase("scoring"):
            for group in groups:
                group.rewards = [self.reward(e) for e in group.episodes]
        return groups

    def within_lag(self, groups: Sequence[Group]) -> tuple[list[Group], int]:
        """The groups whose every rollout is at most `max_policy_lag` versions old, and how many were not."""
        version, lag = self.backend.version, self.grpo.max_policy_lag
        fresh = [g for g in groups if all(version - e.policy_version <= lag for e in g.episodes)]
        return fresh, len(groups) - len(fresh)

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
            metrics = self.trainer.update(batch)
        with self.times.phase("push"):
            push = self.push(self.backend.version + 1)
        return Update(metrics, True, push)

    def push(self, version: int) -> Any:
        """Load the policy into the rollout backend as `version`, streamed tensor by tensor."""
        return self.backend.update_weights(PolicyWeights(self.trainer), version=version)

    def policy_record(self, step: int, update: Update) -> dict[str, Any] | None:
        """The `PolicyUpdated` record of the step's push."""
        if update.push is None:
            return None
        push = update.push
        return {"event_id": policy_event_id(self.run_id, push.version), "run_id": self.run_id, "step": step,
                "version": push.version, "backend": self.backend.name, "bytes": push.bytes,
                "seconds": push.seconds, "servers": push.servers, "servers_behind": push.servers_behind,
                "produced_at": int(time.time() * 1000)}

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

    def record(self, step: int, rollouts: Rollouts, trainable: Sequence[Group], update: Update,
               trajectory_count: int, started: float, lags: Sequence[int] = (), stale: int = 0) -> StepRecord:
        """The step's record, before its evaluation and publishing (`started`: the step's perf_counter
        start; `trainable`: the groups within the lag bound, `lags` their rollouts' staleness)."""
        lags = lags if update.trained else []
        rewards = [r for g in rollouts.groups for r in g.rewards]
        synthesized = [g for g in trainable if g.drawn.source == "synthesized" and not g.flat] \
            if update.trained else []
        return StepRecord(
            event_id=step_event_id(self.run_id, step), run_id=self.run_id, step=step,
            trajectory_count=trajectory_count, policy_version=self.backend.version,
            train_reward=sum(rewards) / len(rewards), eval_success=None, loss=update.metrics.get("loss"),
            duration_seconds=time.perf_counter() - started,
            pool_size=self.pool.size, pool_synthesized=len(self.pool.synthesized),
            zero_variance_groups=sum(g.flat for g in rollouts.groups), resampled_groups=rollouts.resampled,
            tokens_trained=int(update.metrics.get("loss_tokens", 0)) if update.trained else 0,
            synthesized_trained=sum(len(g.episodes) for g in synthesized),
            synthesized_tasks_trained=len({g.drawn.task.task_id for g in synthesized}),
            staleness_max=max(lags) if lags else None, staleness_mean=sum(lags) / len(lags) if lags else None,
            stale_groups=stale,
            rollout_seconds=self.times.rollout, scoring_seconds=self.times.scoring,
            training_seconds=self.times.training, push_seconds=self.times.push, publish_seconds=None,
            blocked_seconds=rollouts.blocked, produced_at=int(time.time() * 1000))
