"""One GRPO step's assembly on real BFCL episodes, with a scripted backend and a recording engine."""
import itertools
from collections import Counter

import pytest

from coevolve.schemas.codec import default_registry
from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, SamplerConfig
from coevolve.services.learner.loop.sampler import TaskPool
from coevolve.services.learner.loop.record import PHASES, StepRecord
from coevolve.services.learner.loop.step import StepRunner, reward_function, step_event_id, tool_overlap
from tests.agent_helpers import ScriptedBackend, byte_tokenizer

LIMITS = EpisodeLimits(max_user_turns=1, max_context_tokens=100_000)
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=8)


class RecordingEngine:
    """Keeps every batch it is asked to train on."""

    def __init__(self):
        self.batches = []

    def update(self, batch):
        self.batches.append(list(batch))
        return {"loss": 0.25, "loss_tokens": float(sum(s.loss_tokens for s in batch))}

    def named_parameters(self):
        return iter(())


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def says_yes(episode) -> float:
    return float(any("yes" in m["content"] for m in episode.messages if m["role"] == "assistant"))


def runner(tokenizer, answers, tasks=3, **cfg):
    answers = itertools.cycle(answers)
    backend = ScriptedBackend(tokenizer, lambda request: next(answers))
    pool = TaskPool(load_tasks(split="train")[:tasks], SamplerConfig(), rng_seed=1)
    engine = RecordingEngine()
    learner = LearnerConfig(**{"batch_tasks": 2, "group_size": 3, **cfg})
    return StepRunner(learner, GRPOConfig(), pool, backend, engine, SAMPLING, LIMITS, "run-t", says_yes), engine


def test_a_step_rolls_out_b_times_k_scores_trains_pushes_and_records(tokenizer):
    steps, engine = runner(tokenizer, ["yes", "no", "no"])
    result = steps.run(1)
    rec = result.record
    assert len(result.trajectories) == rec.trajectory_count == 6
    assert rec.train_reward == pytest.approx(2 / 6) and rec.zero_variance_groups == 0
    assert rec.policy_version == 1 == steps.backend.version and result.trained
    assert [s.advantage > 0 for s in engine.batches[0]] == [True, False, False] * 2
    assert rec.tokens_trained == sum(s.loss_tokens for s in engine.batches[0]) > 0 and result.batch == engine.batches[0]
    assert rec.event_id == step_event_id("run-t", 1) and rec.blocked_seconds >= 0
    assert (rec.staleness_max, rec.staleness_mean, rec.stale_groups) == (0, 0.0, 0)
    assert result.policy_update["version"] == 1 and result.policy_update["step"] == 1
    assert all(getattr(rec, f"{p}_seconds") >= 0 for p in ("rollout", "scoring", "training", "push"))
    assert rec.publish_seconds is None and rec.eval_success is None
    assert rec.duration_seconds >= rec.rollout_seconds + rec.training_seconds
    for i, traj in enumerate(result.trajectories):
        assert traj["rollout_index"] == i % 3 and traj["group_size"] == 3 and traj["policy_version"] == 0
        assert traj["task_source"] == "seed" and traj["step"] == 1
    assert len({t["event_id"] for t in result.trajectories}) == 6
    registry = default_registry()
    registry.encode("StepCompleted", rec.published(0.0).to_event())
    registry.encode("TrajectoryRecorded", result.trajectories[0])
    registry.encode("PolicyUpdated", result.policy_update)


def test_the_step_record_is_the_step_completed_event_field_for_field():
    import dataclasses
    import json
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "StepCompleted.avsc").read_text())
    assert [f.name for f in dataclasses.fields(StepRecord)] == [f["name"] for f in schema["fields"]]
    assert PHASES == ("rollout", "scoring", "training", "push", "publish", "blocked")


def fresh_pool() -> TaskPool:
    """Three seed tasks and one validated task (a copy of another train task), drawn first."""
    pool = TaskPool(load_tasks(split="train")[:3], SamplerConfig(fresh_first=True), rng_seed=1)
    base = load_tasks(split="train")[5]
    pool.offer({**base.to_record(), "task_id": "syn-1", "verdict": "validated", "source": "synthesized"})
    pool.refresh(1)
    return pool


def test_a_step_counts_the_synthesized_rollouts_its_update_trained_on(tokenizer):
    steps, _ = runner(tokenizer, ["yes", "no", "no"])
    steps.pool = fresh_pool()
    result = steps.run(1)
    rec = result.record
    assert (rec.synthesized_trained, rec.synthesized_tasks_trained, rec.pool_synthesized) == (3, 1, 1)
    assert [t["task_source"] for t in result.trajectories].count("synthesized") == 3
    flat, _ = runner(tokenizer, ["no"])
    flat.pool = fresh_pool()
    rec = flat.run(1).record  # drawn, but no update: nothing synthesized was trained on
    assert rec.synthesized_trained == rec.synthesized_tasks_trained == 0 and rec.loss is None


def test_equal_rewards_everywhere_skip_the_update(tokenizer):
    steps, engine = runner(tokenizer, ["no"])
    result = steps.run(1)
    assert not result.trained and engine.batches == [] and steps.backend.version == 0
    assert result.record.zero_variance_groups == 2 and result.record.loss is None and result.batch == []
    assert result.record.tokens_trained == 0 and result.record.trajectory_count == 6
    assert result.record.training_seconds == result.record.push_seconds == 0.0


def test_dynamic_sampling_replaces_flat_groups_with_other_tasks_and_publishes_every_rollout(tokenizer):
    # the first 6 rollouts (2 groups) all say no; later rounds mix yes and no
    steps, engine = runner(tokenizer, ["no"] * 6 + ["yes", "no", "no"] * 10, tasks=6, dynamic_sampling=True,
                           max_resample=2)
    result = steps.run(1)
    rec = result.record
    assert rec.resampled_groups == 2 and rec.zero_variance_groups == 2
    assert rec.trajectory_count == len(result.trajectories) == 12
    per_task = Counter(t["task_id"] for t in result.trajectories)
    assert len(per_task) == 4 and set(per_task.values()) == {3}  # one group per task and step
    (batch,) = engine.batches
    assert len(batch) == 6 and sum(s.advantage > 0 for s in batch) == 2


def test_redraws_end_when_the_step_has_rolled_out_every_task_of_the_pool(tokenizer):
    steps, engine = runner(tokenizer, ["no"], tasks=3, dynamic_sampling=True, max_resample=5)
    result = steps.run(1)
    per_task = Counter(t["task_id"] for t in result.trajectories)
    assert len(per_task) == 3 and set(per_task.values()) == {3}
    assert result.record.resampled_groups == 1 and result.record.zero_variance_groups == 3
    assert not result.trained and engine.batches == []


def test_a_task_drawn_twice_keeps_distinct_rollout_indices(tokenizer):
    steps, _ = runner(tokenizer, ["yes", "no"], batch_tasks=5)  # the pool has 3 tasks
    result = steps.run(1)
    keys = [(t["task_id"], t["rollout_index"]) for t in result.trajectories]
    assert len(set(keys)) == 15 and len({t["event_id"] for t in result.trajectories}) == 15


def test_rewards_are_success_or_partial_score():
    class Ep:
        success, score = False, 0.5
    assert reward_function("binary")(Ep()) == 0.0 and reward_function("partial")(Ep()) == 0.5
    with pytest.raises(ValueError, match="unknown reward 'length'"):
        reward_function("length")


def test_the_shaped_reward_credits_the_reference_tools_turn_by_turn():
    from coevolve.services.agent.episodes import Episode
    task = Task("t", ("a", "b", "c"), {}, ("GorillaFileSystem",),
                reference=(("cd(folder='x')", "ls()"), (), ("cat(file_name='y')",)))

    def episode(calls, score=0.0, turns=2):
        return Episode(task, calls=calls, score=score, turns=turns)

    shaped = reward_function("shaped")
    # turn 1: ls matches one of two reference calls (1/2); turn 2 asks for no call and makes none (1)
    assert tool_overlap(episode([["ls()"], []])) == 0.75
    # an extra call is not free: 2 right of 3 made; a call where none was wanted scores 0
    assert tool_overlap(episode([["cd(folder='z')", "ls()", "ls()"], ["pwd()"]])) == pytest.approx(1 / 3)
    assert tool_overlap(episode([], turns=2)) == 0.5  # a truncated episode: no call in either turn
    assert shaped(episode([["cd(folder='x')", "ls()"], []], score=1 / 3)) == pytest.approx(0.25 + 0.25)
    # rollouts that all fail the turns but pick different tools now score unlike
    assert len({shaped(episode(c)) for c in ([["ls()"], []], [["mv()"], []], [["cd()", "ls()"], []])}) == 3


def test_evaluation_is_due_every_e_steps_and_after_the_last():
    from coevolve.services.learner.loop.evaluation import due, evaluation_event_id

    cfg = LearnerConfig(steps=7, eval_every=3)
    assert [s for s in range(1, 8) if due(cfg, s)] == [3, 6, 7]
    assert not any(due(LearnerConfig(steps=7), s) for s in range(1, 8))
    assert evaluation_event_id("run-a", 3, "test") == "eval-run-a-3-test"


def test_an_evaluated_task_is_cut_to_the_turns_the_learner_plays():
    from coevolve.services.envs import bfcl_data
    from coevolve.services.envs.bfcl import score_calls
    from coevolve.services.learner.loop.evaluation import played

    task = bfcl_data.get_task("multi_turn_base_0")
    first = played(task, 1)
    assert (first.turns, first.reference) == (task.turns[:1], task.reference[:1])
    assert played(task, 10) is task
    # the first turn's reference calls now succeed: the whole task could not, with one turn played
    assert score_calls(first, [list(task.reference[0])])["success"]
    assert not score_calls(task, [list(task.reference[0])])["success"]
    miss_func = next(t for t in bfcl_data.load_category("multi_turn_miss_func") if t.added_tools)
    turn = min(miss_func.added_tools)
    assert played(miss_func, turn).added_tools == {}
