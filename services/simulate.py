"""A workload simulator: a realistic event stream of a CoEvolve run, for demos, tests and benchmarks.

Each task has a skill curve that rises as the agent learns it and dips when the agent forgets it.
A rollout passes each user turn with the task's current skill; its score is the fraction of turns
passed. Actions come from a BFCL-like tool vocabulary with Zipf-distributed popularity, so a few tools
are rare. Synthesized tasks (with validator verdicts) join the pool as the run goes on, with longer
horizons, as in the paper.
"""
from __future__ import annotations

import json
import math
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from coevolve.services.runtime.config import ConfigError, doc

TOOLS = (
    "ls", "cd", "cat", "mkdir", "touch", "echo", "grep", "mv", "cp", "pwd", "find", "wc", "sort", "diff",
    "tail", "rm", "du", "post_tweet", "comment", "retweet", "follow_user", "send_message",
    "view_messages_sent", "delete_message", "add_contact", "create_ticket", "get_ticket", "close_ticket",
    "get_stock_info", "place_order", "cancel_order", "get_account_info", "add_to_watchlist",
    "book_flight", "get_flight_cost", "cancel_booking", "compute_exchange_rate", "set_budget_limit",
    "startEngine", "fillFuelTank", "lockDoors", "pressBrakePedal", "check_tire_pressure",
    "estimate_distance", "activateParkingBrake", "mean", "add", "divide", "logarithm", "square_root",
)
NAMESPACE = uuid.UUID("6f1c3c52-6a55-4f6b-9c43-2c1f0f6b8e51")


@dataclass(frozen=True)
class SimulationConfig:
    run_id: str = doc("sim-run", "Run id stamped on every event.")
    tasks: int = doc(40, "Seed tasks in the pool.")
    steps: int = doc(20, "Training steps to simulate.")
    batch_tasks: int = doc(16, "Tasks sampled per step.")
    group_size: int = doc(8, "Rollouts per task per step (K).")
    forget_probability: float = doc(0.04, "Chance per task and step that the agent starts forgetting it.")
    zipf_exponent: float = doc(1.3, "Popularity skew of the tool vocabulary; higher makes more tools rare.")
    synthesized_per_step: int = doc(3, "Tasks the simulated validator judges per step; 0 disables.")
    validation_pass_rate: float = doc(0.8, "Share of synthesized tasks validated.")
    seed: int = doc(0, "Random seed: the same seed yields the same events.")

    def __post_init__(self) -> None:
        for name in ("tasks", "steps", "batch_tasks", "group_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.batch_tasks > self.tasks:
            raise ConfigError(f"batch_tasks ({self.batch_tasks}) exceeds tasks ({self.tasks}); lower it")
        if not 0 <= self.forget_probability <= 1 or not 0 <= self.validation_pass_rate <= 1:
            raise ConfigError("forget_probability and validation_pass_rate are probabilities in [0, 1]")


@dataclass
class _Task:
    task_id: str
    source: str
    plan: list[list[str]]  # per turn, the tool names a correct solution calls
    onset: float  # step at which skill reaches one half
    speed: float
    forgetting_until: int = -1
    forgetting_depth: float = 0.0

    def skill(self, step: int) -> float:
        x = max(-60.0, min(60.0, self.speed * (step - self.onset)))  # no overflow on long runs
        base = 1.0 / (1.0 + math.exp(-x))
        if step <= self.forgetting_until:
            base *= 1.0 - self.forgetting_depth
        return base


def _uid(*parts: object) -> str:
    return str(uuid.uuid5(NAMESPACE, "/".join(map(str, parts))))


class Simulator:
    """Yield (topic, key, record name, event) tuples for a whole run, deterministically by seed."""

    def __init__(self, config: SimulationConfig):
        self.cfg = config
        self.rng = random.Random(config.seed)
        weights = [1.0 / (rank + 1) ** config.zipf_exponent for rank in range(len(TOOLS))]
        self.tool_weights = weights
        self.pool = [self._new_task(f"seed-{i:04d}", "seed", self.rng.randint(1, 4)) for i in range(config.tasks)]
        self.synthesized = 0

    def _tools(self, k: int) -> list[str]:
        return self.rng.choices(TOOLS, weights=self.tool_weights, k=k)

    def _new_task(self, task_id: str, source: str, turns: int) -> _Task:
        plan = [self._tools(self.rng.randint(1, 3)) for _ in range(turns)]
        return _Task(task_id, source, plan, onset=self.rng.uniform(-2, self.cfg.steps), speed=self.rng.uniform(0.3, 1.2))

    def _rollout(self, task: _Task, step: int, index: int, now_ms: int) -> dict:
        skill = task.skill(step)
        actions, passed = [], 0
        for turn, calls in enumerate(task.plan):
            ok = self.rng.random() < skill
            passed += ok
            used = list(calls) if ok else self._perturb(calls)
            for name in used:
                args = json.dumps({"arg": self.rng.randint(0, 9)})
                actions.append({"name": name, "arguments": args, "observation": f"{name} -> ok", "turn": turn})
        turns = len(task.plan)
        score = passed / turns
        return {
            "event_id": _uid(self.cfg.run_id, self.cfg.seed, "traj", step, task.task_id, index),
            "run_id": self.cfg.run_id, "step": step, "task_id": task.task_id, "task_source": task.source,
            "rollout_index": index, "group_size": self.cfg.group_size, "score": score,
            "success": passed == turns, "actions": actions, "turn_count": turns, "policy_version": step,
            "prompt": "", "response": "", "prompt_tokens": 120 * turns, "completion_tokens": 24 * len(actions),
            "produced_at": now_ms,
        }

    def _perturb(self, calls: list[str]) -> list[str]:
        roll = self.rng.random()
        if roll < 0.3:
            return calls[:-1]
        if roll < 0.7:
            return calls + self._tools(1)
        return self._tools(len(calls))

    def _maybe_forget(self, task: _Task, step: int) -> None:
        if step > task.forgetting_until and self.rng.random() < self.cfg.forget_probability:
            task.forgetting_until = step + self.rng.randint(1, 3)
            task.forgetting_depth = self.rng.uniform(0.5, 0.9)

    def _synthesize(self, step: int, now_ms: int) -> Iterator[tuple[str, str, str, dict]]:
        for _ in range(self.cfg.synthesized_per_step):
            self.synthesized += 1
            task = self._new_task(f"syn-{self.synthesized:05d}", "synthesized", self.rng.randint(2, 6))
            task.onset = step + self.rng.uniform(0, self.cfg.steps / 2)
            validated = self.rng.random() < self.cfg.validation_pass_rate
            event = {
                "event_id": _uid(self.cfg.run_id, self.cfg.seed, "task", task.task_id),
                "task_id": task.task_id, "run_id": self.cfg.run_id, "step": step, "source": "synthesized",
                "verdict": "validated" if validated else "rejected",
                "reason": "dual pass: partial reward > 0" if validated else "not executable: reference call failed",
                "env": "bfcl", "instruction_turns": [f"turn {t}" for t in range(len(task.plan))],
                "initial_state": "{}", "involved_classes": ["GorillaFileSystem"],
                "reference_solution": [[f"{n}()" for n in calls] for calls in task.plan],
                "signal_ids": [], "exploration_ids": [],
                "validation_score": self.rng.uniform(0.2, 1.0) if validated else 0.0, "produced_at": now_ms,
            }
            if validated:
                self.pool.append(task)
            yield "coevolve.tasks", task.task_id, "TaskChecked", event

    def events(self) -> Iterator[tuple[str, str, str, dict]]:
        cfg = self.cfg
        for step in range(cfg.steps):
            now_ms = int(time.time() * 1000)
            batch = self.rng.sample(self.pool, cfg.batch_tasks)
            scores = []
            for task in batch:
                self._maybe_forget(task, step)
                for index in range(cfg.group_size):
                    event = self._rollout(task, step, index, now_ms)
                    scores.append(event["score"])
                    yield "coevolve.trajectories", task.task_id, "TrajectoryRecorded", event
            held_out = [t.skill(step) for t in self.pool[: cfg.tasks]]
            yield "coevolve.steps", cfg.run_id, "StepCompleted", {
                "event_id": _uid(cfg.run_id, cfg.seed, "step", step), "run_id": cfg.run_id, "step": step,
                "trajectory_count": len(scores), "policy_version": step,
                "train_reward": sum(scores) / len(scores), "eval_success": sum(held_out) / len(held_out),
                "loss": None, "duration_seconds": None, "produced_at": now_ms,
            }
            yield from self._synthesize(step, now_ms)


def write_file(config: SimulationConfig, path) -> tuple[dict[str, int], list]:
    """Write the run to Avro container files; return counts per event type and the files."""
    from tqdm import tqdm

    from coevolve.schemas.container import LogWriter

    sim = Simulator(config)
    with LogWriter(path) as writer, tqdm(total=config.steps, desc="simulate", unit="step", leave=False) as bar:
        for _topic, _key, name, event in sim.events():
            writer.write(name, event)
            if name == "StepCompleted":
                bar.update(1)
    return writer.counts, writer.close()  # close() again only lists the files


def publish(config: SimulationConfig, bootstrap: str, rate: float = 0.0) -> dict[str, int]:
    """Publish the run to Kafka at `rate` events/s (0: as fast as possible); return counts."""
    from tqdm import tqdm

    from coevolve.services.kafka.producer import EventProducer

    counts: dict[str, int] = {}
    start = time.monotonic()
    sent = 0
    with EventProducer(bootstrap, client_id="coevolve-simulate") as producer, \
            tqdm(total=config.steps, desc="simulate", unit="step", leave=False) as bar:
        for topic, key, name, event in Simulator(config).events():
            producer.send(topic, event, key=key, record_name=name)
            counts[name] = counts.get(name, 0) + 1
            sent += 1
            if rate > 0:
                ahead = sent / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
            if name == "StepCompleted":
                producer.flush()  # a step's events are confirmed before the next step starts
                bar.update(1)
    return counts
