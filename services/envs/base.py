"""The environment contract shared by the learner, explorer and validator.

A `Task` is plain data; the same shape holds a BFCL seed task and a synthesized one (it converts to and
from the `TaskChecked` event's fields), so a validated task runs exactly like a seed task. An
`Environment` runs one episode of one task at a time: `reset(task)` gives the first observations,
`step(action)` runs the agent's output and says whether the episode is done and how it scores.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

Message = dict[str, Any]
"""A chat message: `{"role": "system"|"user"|"tool", "content": str, ...}` (tools carry `name`)."""


@dataclass(frozen=True)
class Task:
    """One multi-turn task. Treat `initial_state` as read-only: episodes copy it before use."""

    task_id: str
    turns: tuple[str, ...]
    """The user's message at each turn."""
    initial_state: Mapping[str, Any]
    """Per tool class, the configuration its instance is loaded from."""
    involved_classes: tuple[str, ...]
    reference: tuple[tuple[str, ...], ...] = ()
    """Per turn, the reference call sequence (BFCL call syntax); empty when the task is unscored."""
    added_tools: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    """Tools withheld until the given turn index (BFCL's miss_func category)."""
    long_context: bool = False
    """Load the backends' long-context scenario extensions (BFCL's long_context category)."""
    env: str = "bfcl"

    def __post_init__(self) -> None:
        if self.reference and len(self.reference) != len(self.turns):
            raise ValueError(f"task {self.task_id}: {len(self.turns)} turns but "
                             f"{len(self.reference)} reference turns")

    @property
    def scored(self) -> bool:
        return bool(self.reference)

    def to_record(self) -> dict[str, Any]:
        """The task's fields in the `TaskChecked` event's shape. The state keeps its key order: BFCL's
        file system takes the first key of `root` as its root directory, so sorted keys are another task."""
        return {"task_id": self.task_id, "env": self.env, "instruction_turns": list(self.turns),
                "initial_state": json.dumps(self.initial_state),
                "involved_classes": list(self.involved_classes),
                "reference_solution": [list(turn) for turn in self.reference]}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Task":
        """Build a task from a `TaskChecked` event (or any mapping with its field names).

        The event carries no long-context flag; as in BFCL, it follows from the id naming the category.
        """
        state = record["initial_state"]
        if isinstance(state, str):
            state = json.loads(state)
        if not isinstance(state, dict):
            raise ValueError(f"task {record.get('task_id')}: initial_state must be a JSON object")
        task_id = str(record["task_id"])
        return cls(task_id=task_id, turns=tuple(record["instruction_turns"]), initial_state=state,
                   involved_classes=tuple(record["involved_classes"]),
                   reference=tuple(tuple(turn) for turn in record.get("reference_solution") or ()),
                   long_context="long_context" in task_id, env=record.get("env") or "bfcl")


@dataclass(frozen=True)
class TurnVerdict:
    """How one finished turn compares with its reference."""

    turn: int
    passed: bool
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "passed": self.passed, "reason": self.reason, **self.details}


@dataclass(frozen=True)
class StepResult:
    """What one `step` returns.

    `score` is the fraction of the task's turns passed so far, in [0, 1] (the partial reward);
    `success` is true only once every turn has passed.
    """

    observations: list[Message]
    done: bool
    score: float
    success: bool
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    """One episode at a time; build one environment per concurrent episode."""

    name: str
    turn: int
    """Index of the current user turn (equals the number of turns once every turn has ended)."""

    def reset(self, task: Task) -> list[Message]:
        """Start an episode: the system prompt with the tool schemas, then the first user turn."""

    def step(self, action: str | Sequence[str | Mapping[str, Any]]) -> StepResult:
        """Run the agent's output: tool calls run and return observations; anything else ends the turn."""

    def verdicts(self) -> list[TurnVerdict]:
        """The verdicts of the turns finished so far."""

    def terminate(self, reason: str) -> StepResult:
        """End the episode now (a limit of the caller's was hit): this and later turns fail with `reason`."""


Policy = Callable[[list[Message]], "str | Sequence[str | Mapping[str, Any]]"]
"""Maps the conversation so far to the agent's next output."""


def run_episode(env: Environment, task: Task, policy: Policy) -> tuple[list[Message], StepResult]:
    """Play one episode: the transcript (observations and the agent's outputs) and the last result.

    Ends because the environment says so: every turn ended, or a step limit or the timeout was hit.
    """
    transcript = list(env.reset(task))
    while True:
        action = policy(transcript)
        content = action if isinstance(action, str) else json.dumps(list(action), default=str)
        transcript.append({"role": "assistant", "content": content})
        result = env.step(action)
        transcript.extend(result.observations)
        if result.done:
            return transcript, result
