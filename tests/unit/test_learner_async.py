"""Bounded-staleness steps (max_policy_lag): look-ahead rollouts, the lag bound, the journaled pool state."""
import itertools
import threading

import pytest

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, SamplerConfig
from coevolve.services.learner.loop.sampler import TaskPool
from coevolve.services.learner.loop.step import StepRunner
from tests.agent_helpers import ScriptedBackend, byte_tokenizer

LIMITS = EpisodeLimits(max_user_turns=1, max_context_tokens=100_000)
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def says_yes(episode) -> float:
    return float(any("yes" in m["content"] for m in episode.messages if m["role"] == "assistant"))


class WaitingEngine:
    """Its first update waits until the backend has answered `wanted` requests, and notes whether it saw them."""

    def __init__(self, backend, wanted: int):
        self.backend, self.wanted, self.batches, self.overlapped = backend, wanted, [], None

    def update(self, batch):
        if self.overlapped is None:
            self.overlapped = self.backend.answered.wait(10) and len(self.backend.completions) >= self.wanted
        self.batches.append(list(batch))
        return {"loss": 0.1, "loss_tokens": float(sum(s.loss_tokens for s in batch))}

    def named_parameters(self):
        return iter(())


class CountingBackend(ScriptedBackend):
    """Sets `answered` once `wanted` requests have been answered."""

    def __init__(self, tokenizer, script, wanted: int, behind: set[int] = frozenset()):
        super().__init__(tokenizer, script)
        self.answered, self.wanted, self.behind, self.calls = threading.Event(), wanted, behind, 0

    def generate(self, requests, sampling):
        out = super().generate(requests, sampling)
        self.calls += 1
        if self.calls in self.behind:  # a server a failed transfer left on version 0
            out = [type(c)(**{**c.__dict__, "policy_version": 0}) for c in out]
        if len(self.completions) >= self.wanted:
            self.answered.set()
        return out


def runner(tokenizer, lag: int, behind=frozenset(), **cfg):
    answers = itertools.cycle(["yes", "no", "no"])
    backend = CountingBackend(tokenizer, lambda request: next(answers), wanted=12, behind=behind)
    pool = TaskPool(load_tasks(split="train")[:3], SamplerConfig(), rng_seed=1)
    engine = WaitingEngine(backend, wanted=12)
    learner = LearnerConfig(**{"batch_tasks": 2, "group_size": 3, **cfg})
    steps = StepRunner(learner, GRPOConfig(max_policy_lag=lag), pool, backend, engine, SAMPLING, LIMITS, "run-a",
                       says_yes)
    return steps, engine


def test_with_lag_1_the_next_steps_rollouts_are_generated_while_a_step_trains(tokenizer):
    steps, engine = runner(tokenizer, lag=1)
    try:
        first, second, third = (steps.run(s) for s in (1, 2, 3))
    finally:
        steps.close()
    assert engine.overlapped  # step 2's 6 rollouts were answered before step 1's update finished
    assert (first.record.staleness_max, second.record.staleness_max) == (0, 1)
    assert third.record.staleness_max in (0, 1)  # made during or after step 2's update
    assert second.record.staleness_mean == 1.0 and second.record.stale_groups == 0
    assert [t["policy_version"] for t in second.trajectories] == [0] * 6  # made before step 1's push
    for result in (first, second, third):
        assert result.record.policy_version - 1 - min(t["policy_version"] for t in result.trajectories) <= 1


def test_with_lag_0_nothing_is_generated_ahead(tokenizer):
    steps, engine = runner(tokenizer, lag=0)
    first, second = steps.run(1), steps.run(2)
    assert engine.overlapped is False and steps._ahead == {}
    assert (first.record.staleness_max, second.record.staleness_max) == (0, 0)


def test_a_group_from_a_policy_beyond_the_lag_is_published_but_not_trained_on(tokenizer):
    steps, engine = runner(tokenizer, lag=0, behind={2})  # step 2's only generate call answers from version 0
    steps.run(1)
    result = steps.run(2)
    assert result.record.stale_groups == 2 and len(result.trajectories) == 6
    assert not result.trained and len(engine.batches) == 1 and result.record.staleness_max is None


def test_the_journaled_pool_state_redraws_what_the_look_ahead_drew(tokenizer):
    steps, _ = runner(tokenizer, lag=1)
    try:
        first, second = steps.run(1), steps.run(2)
    finally:
        steps.close()
    resumed = TaskPool(load_tasks(split="train")[:3], SamplerConfig(), rng_seed=99)
    resumed.restore(first.pool_state)  # a stop after step 1 abandons the rollouts of step 2
    resumed.refresh(2)
    redrawn = [d.task.task_id for d in resumed.draw(2)]
    assert redrawn == list(dict.fromkeys(t["task_id"] for t in second.trajectories))


def test_closing_abandons_the_look_ahead(tokenizer):
    steps, _ = runner(tokenizer, lag=2)
    steps.run(1)
    assert sorted(steps._ahead) == [2, 3]
    steps.close()
    assert steps._ahead == {}
