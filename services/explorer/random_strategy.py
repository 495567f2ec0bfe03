"""The `random` exploration strategy: random valid tool calls, run for real in the BFCL environment.

Each run starts from the task's initial state in a fresh environment and makes up to S calls. Every
call names a tool of the task's involved classes; its arguments are drawn, by the tool's JSON schema
types, from the values the episode has revealed so far: the initial state (keys and values) and every
observation since (parsed as JSON when it is JSON). No signal is read. The random generator is seeded
by (seed, task, round), so the same inputs give the same calls, observations and tuples. An
environment error is an observation like any other.
"""
from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import BfclConfig, BfclEnv

_LONGEST_VALUE = 120
_OPTIONAL_SHARE = 0.5


def is_error_observation(observation: str) -> bool:
    """Whether a call's observation reports a failure (the BFCL environment's error forms)."""
    if observation.startswith(("Invalid action", "Error during execution")):
        return True
    try:
        value = json.loads(observation)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


@dataclass(frozen=True)
class ExploredCall:
    """One call an exploration made and what the environment returned."""

    name: str
    arguments: dict[str, Any]
    observation: str

    def to_tuple(self, task_id: str) -> dict[str, str]:
        """The call as an `ExplorationRecorded` tuple (arguments as a JSON object)."""
        return {"name": self.name, "arguments": json.dumps(self.arguments, sort_keys=True),
                "observation": self.observation, "task_id": task_id}


@dataclass(frozen=True)
class ExplorationRun:
    """One independent run (round) of exploration on one task."""

    task_id: str
    round: int
    calls: tuple[ExploredCall, ...]

    def tuples(self) -> list[dict[str, str]]:
        return [call.to_tuple(self.task_id) for call in self.calls]

    @classmethod
    def from_actions(cls, task_id: str, round_: int, actions: Iterable[Mapping[str, Any]]) -> "ExplorationRun":
        """A run from an episode's actions in `TrajectoryRecorded` form (name, JSON arguments, observation),
        as a signal-guided exploration's episode records them; unreadable arguments are kept as text."""
        calls = []
        for action in actions:
            try:
                arguments = json.loads(action["arguments"]) if action["arguments"] else {}
            except ValueError:
                arguments = {"_unparsed": action["arguments"]}
            if not isinstance(arguments, dict):
                arguments = {"_unparsed": action["arguments"]}
            calls.append(ExploredCall(action["name"], arguments, action["observation"]))
        return cls(task_id, round_, tuple(calls))


class ValuePool:
    """Values revealed so far, by JSON type, in first-seen order (so drawing is deterministic)."""

    def __init__(self) -> None:
        self.strings: dict[str, None] = {}
        self.integers: dict[int, None] = {}
        self.numbers: dict[float, None] = {}

    def add(self, value: Any) -> None:
        """Add every key and scalar inside a JSON-like value."""
        if isinstance(value, dict):
            for key, item in value.items():
                self.add(key)
                self.add(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                self.add(item)
        elif isinstance(value, bool) or value is None:
            return
        elif isinstance(value, int):
            self.integers[value] = None
        elif isinstance(value, float):
            self.numbers[value] = None
        elif isinstance(value, str) and 0 < len(value) <= _LONGEST_VALUE:
            self.strings[value] = None

    def add_observation(self, text: str) -> None:
        """Add what a call revealed; an error reveals nothing worth drawing from."""
        if is_error_observation(text):
            return
        try:
            self.add(json.loads(text))
        except ValueError:
            self.add(text)

    def draw(self, schema: dict[str, Any], rng: random.Random) -> Any:
        """A value of the schema's type, from the pool when it has one."""
        kind = schema.get("type")
        if "enum" in schema:
            return rng.choice(list(schema["enum"]))
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "integer":
            return rng.choice(list(self.integers)) if self.integers else rng.randint(0, 10)
        if kind == "number":
            numbers = list(self.integers) + list(self.numbers)
            return rng.choice(numbers) if numbers else rng.randint(0, 10)
        if kind == "array":
            return [self.draw(schema.get("items") or {"type": "string"}, rng) for _ in range(rng.randint(1, 3))]
        if kind == "object":
            return {}
        return rng.choice(list(self.strings)) if self.strings else ""


def draw_arguments(tool: dict[str, Any], pool: ValuePool, rng: random.Random) -> dict[str, Any]:
    """Arguments for one tool: every required parameter, each optional one half the time."""
    parameters = tool["function"].get("parameters") or {}
    required = set(parameters.get("required") or ())
    arguments = {}
    for name, schema in (parameters.get("properties") or {}).items():
        if name in required or rng.random() < _OPTIONAL_SHARE:
            arguments[name] = pool.draw(schema, rng)
    return arguments


def random_run(task: Task, round_: int, calls: int, seed: int) -> ExplorationRun:
    """One run of up to `calls` random calls from the task's initial state."""
    rng = random.Random(f"{seed}:{task.task_id}:{round_}")
    unscored = dataclasses.replace(task, reference=())
    env = BfclEnv(BfclConfig(max_steps_per_turn=calls, max_steps=calls))
    env.reset(unscored)
    tools = sorted(bfcl_data.tools_at(task, len(task.turns) - 1), key=lambda t: t["function"]["name"])
    pool = ValuePool()
    pool.add(task.initial_state)
    made: list[ExploredCall] = []
    for _ in range(calls):
        tool = rng.choice(tools)
        arguments = draw_arguments(tool, pool, rng)
        result = env.step([{"name": tool["function"]["name"], "arguments": arguments}])
        observation = result.observations[0]["content"] if result.observations else ""
        made.append(ExploredCall(tool["function"]["name"], arguments, observation))
        pool.add_observation(observation)
        if result.done:
            break
    return ExplorationRun(task.task_id, round_, tuple(made))


def explore_randomly(task: Task, runs: int, calls: int, seed: int,
                     rounds: Iterable[int] | None = None) -> list[ExplorationRun]:
    """R independent runs (rounds 0..R-1 unless given), each up to S calls."""
    return [random_run(task, r, calls, seed) for r in (rounds if rounds is not None else range(runs))]
