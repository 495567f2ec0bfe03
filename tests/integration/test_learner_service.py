"""`coevolve learner` against the real embedded broker with the `tiny-random` model (transformers rollouts).

A run publishes B * K trajectories and one StepCompleted per step; validated tasks published mid-step
join the pool at the next step and leave it after a later rejection; a run stopped by SIGTERM after
step 1 resumes at step 2 with the same run id.
"""
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from coevolve.services.agent.config import BackendConfig, EpisodeLimits
from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.envs.config import SeedPoolConfig
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import EVALUATIONS, POLICY, STEPS, TASKS, TRAJECTORIES
from coevolve.services.learner.loop.checkpoint import latest_checkpoint
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, LearnerSettings
from coevolve.services.learner.loop.service import Learner
from coevolve.services.runtime.config import ConfigError

pytestmark = [pytest.mark.slow, pytest.mark.integration]

B, K = 2, 2
BACKEND = BackendConfig(model="tiny-random", backend="transformers", dtype="float32")
LIMITS = EpisodeLimits(max_user_turns=1, max_context_tokens=8000)


def odd_length(episode) -> float:
    """A reward with variance between rollouts (the first sampled id is odd), so steps train and push."""
    generated = episode.token_ids[episode.prompt_len:episode.prompt_len + 1]
    return float(generated[0] % 2) if generated else 0.0


def learner(bootstrap, workdir, steps, reward=odd_length, **kwargs) -> Learner:
    cfg = LearnerConfig(kafka_bootstrap=bootstrap, workdir=workdir, steps=steps, batch_tasks=B, group_size=K,
                        max_new_tokens=8, **kwargs)
    return Learner(LearnerSettings(cfg, GRPOConfig(lr=1e-3), seeds=SeedPoolConfig(seed_tasks=3), backend=BACKEND,
                                   limits=LIMITS), reward=reward)


def read(bootstrap, topics):
    consumer = EventConsumer(bootstrap, topics)
    try:
        return [d.event for d in consumer.drain(idle_s=1.5)]
    finally:
        consumer.close()


def task_checked(verdict: str, task_id: str = "syn-1", run_id: str = "run-it") -> dict:
    """A verdict of the run's own loop (the learner takes in no other run's tasks by default)."""
    return {**load_tasks(split="train")[5].to_record(), "event_id": str(uuid.uuid4()), "task_id": task_id,
            "run_id": run_id, "step": 1, "source": "synthesized", "verdict": verdict, "reason": "",
            "signal_ids": [], "exploration_ids": [], "validation_score": None, "stage": None, "stages": [],
            "seed_task_id": None, "produced_at": int(time.time() * 1000)}


def test_steps_publish_their_rollouts_and_tasks_join_and_leave_between_steps(bootstrap, tmp_path):
    producer = EventProducer(bootstrap)
    service = None
    sent = set()

    def reward(episode):  # runs mid-step: publish a verdict, wait until the feed holds it
        step = service.done + 1
        if step in (1, 2) and step not in sent:
            sent.add(step)
            producer.send(TASKS.name, task_checked("validated" if step == 1 else "rejected"), key="syn-1")
            producer.flush()
            deadline = time.monotonic() + 20
            while service.pool.pending == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert service.pool.pending == 1
        return odd_length(episode)

    service = learner(bootstrap, tmp_path, steps=3, reward=reward, run_id="run-it", eval_every=3, eval_tasks=2)
    service.run()
    producer.close()
    steps = sorted(read(bootstrap, [STEPS.name]), key=lambda e: e["step"])
    trajectories = read(bootstrap, [TRAJECTORIES.name])
    assert [s["step"] for s in steps] == [1, 2, 3] and {s["run_id"] for s in steps} == {"run-it"}
    assert [(s["pool_size"], s["pool_synthesized"]) for s in steps] == [(3, 0), (4, 1), (3, 0)]
    for s in steps:
        mine = [t for t in trajectories if t["step"] == s["step"]]
        assert s["trajectory_count"] == len(mine) == B * K
        assert all(t["group_size"] == K and t["run_id"] == "run-it" for t in mine)
        assert s["publish_seconds"] > 0 and s["rollout_seconds"] > 0 and s["blocked_seconds"] >= 0
    assert len({t["event_id"] for t in trajectories}) == 3 * B * K
    assert steps[-1]["policy_version"] >= 1 and steps[-1]["eval_success"] is not None
    (evaluation,) = read(bootstrap, [EVALUATIONS.name])
    assert evaluation["event_id"] == "eval-run-it-3-test" and evaluation["task_count"] == 2
    assert evaluation["success_rate"] == steps[-1]["eval_success"]
    assert latest_checkpoint(tmp_path).step == 3


@pytest.mark.parametrize("lag", [0, 1])
def test_sigterm_after_step_one_then_resume_continues_at_step_two(bootstrap, tmp_path, lag):
    """With lag 1 a stop abandons the look-ahead's rollouts: each step is published and trained on once."""
    env = {**os.environ, "LEARNER_BATCH_TASKS": str(B), "LEARNER_GROUP_SIZE": str(K), "LEARNER_SEED_TASKS": "3",
           "LEARNER_MAX_USER_TURNS": "1", "LEARNER_MAX_CONTEXT_TOKENS": "8000", "LEARNER_DTYPE": "float32",
           "LEARNER_MAX_POLICY_LAG": str(lag)}
    args = [str(Path(sys.executable).with_name("coevolve")), "learner", "--bootstrap", bootstrap, "--workdir",
            str(tmp_path), "--model", "tiny-random", "--backend", "transformers", "--max-new-tokens", "8"]
    child = subprocess.Popen(args + ["--steps", "50", "--run-id", "run-sig"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    consumer = EventConsumer(bootstrap, [STEPS.name])
    deadline = time.monotonic() + 120
    while not consumer.poll(0.5) and time.monotonic() < deadline:
        assert child.poll() is None, child.stdout.read()
    consumer.close()
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0, out
    stopped_at = latest_checkpoint(tmp_path).step
    assert stopped_at >= 1 and f"completed step {stopped_at} of 50" in out
    done = subprocess.run(args + ["--steps", "2"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--resume" in done.stderr
    target = stopped_at + 1
    done = subprocess.run(args + ["--steps", str(target), "--resume"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    steps = sorted(read(bootstrap, [STEPS.name]), key=lambda e: e["step"])
    assert [s["step"] for s in steps] == list(range(1, target + 1))
    assert {s["run_id"] for s in steps} == {"run-sig"}
    assert latest_checkpoint(tmp_path).step == target
    trajectories = {t["event_id"]: t for t in read(bootstrap, [TRAJECTORIES.name])}.values()
    per_step = Counter(t["step"] for t in trajectories)
    assert per_step == {s: B * K for s in range(1, target + 1)}
    assert all(s["staleness_max"] is None or s["staleness_max"] <= lag for s in steps)
    updates = {u["event_id"]: u for u in read(bootstrap, [POLICY.name])}.values()
    assert sorted(u["version"] for u in updates) == list(range(1, steps[-1]["policy_version"] + 1))


def test_resume_without_a_checkpoint_starts_fresh_and_a_finished_run_stops_at_once(bootstrap, tmp_path):
    first = learner(bootstrap, tmp_path, steps=1, resume=True)
    first.run()
    assert first.done == 1 and latest_checkpoint(tmp_path).run_id == first.run_id
    with pytest.raises(ConfigError, match="--resume"):
        learner(bootstrap, tmp_path, steps=1)
    again = learner(bootstrap, tmp_path, steps=1, resume=True)
    again.run()
    assert again.done == 1 and again.run_id == first.run_id
    assert [s["step"] for s in read(bootstrap, [STEPS.name])] == [1]


def test_zero_steps_evaluate_the_starting_policy_once_and_train_nothing(bootstrap, tmp_path):
    service = learner(bootstrap, tmp_path, steps=0, eval_tasks=1, run_id="zero-shot")
    service.run()
    assert service.done == 0 and latest_checkpoint(tmp_path) is None
    (evaluation,) = read(bootstrap, [EVALUATIONS.name])
    assert (evaluation["step"], evaluation["task_count"], evaluation["policy_version"]) == (0, 1, 0)
    assert read(bootstrap, [STEPS.name, TRAJECTORIES.name]) == []


def test_the_subjects_are_evaluated_from_step_0_apart_from_the_held_out_split(bootstrap, tmp_path):
    seeds = SeedPoolConfig(seed_tasks=3).tasks()
    with EventProducer(bootstrap) as producer:
        producer.send(TASKS.name, {**task_checked("validated", "syn-from-signal", "run-sub"), "signal_ids": ["sig-1"],
                                   "seed_task_id": "syn-named"}, key="syn-from-signal")
        producer.send(TASKS.name, {**task_checked("validated", "syn-named", "run-sub"),
                                   "seed_task_id": "multi_turn_base_9"}, key="syn-named")
        producer.flush()
    learner(bootstrap, tmp_path, steps=2, run_id="run-sub", eval_every=2, eval_tasks=1, eval_subjects=True,
            eval_at_start=True).run()
    evaluations = {(e["split"], e["step"]): e for e in read(bootstrap, [EVALUATIONS.name])}
    assert set(evaluations) == {("test", 0), ("subjects", 0), ("test", 2), ("subjects", 2)}
    assert evaluations[("test", 0)]["task_count"] == 1 and evaluations[("test", 0)]["policy_version"] == 0
    every_seed = sorted(t.task_id for t in seeds)
    assert evaluations[("subjects", 0)]["task_ids"] == every_seed  # before any synthesized task joined the pool
    subjects = evaluations[("subjects", 2)]
    # every seed, then the synthesized task a signal named (syn-named, the subject of syn-from-signal's signal)
    assert subjects["event_id"] == "eval-run-sub-2-subjects" and subjects["task_ids"] == every_seed + ["syn-named"]
    assert len(subjects["scores"]) == 4 and subjects["step"] == 2
    (step,) = [s for s in read(bootstrap, [STEPS.name]) if s["step"] == 2]
    assert step["eval_success"] == evaluations[("test", 2)]["success_rate"]  # the held-out figure, not the subjects'
