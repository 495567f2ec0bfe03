"""BFCL multi-turn as an environment: safe dispatch, isolated episodes, and BFCL's own scoring rule.

Calls run on fresh instances of BFCL's executable backends (imported from `bfcl_eval`), one set per
episode, loaded from the task's initial state. Only public methods of the task's classes are reachable,
with literal arguments parsed by `calls.py`; nothing is evaluated. The instances live in the tool host
when the process bounds its tool calls (`host.py`, in every service), else here (`tools.py`).

Scoring follows BFCL's multi-turn checker: when a turn ends, the turn's reference calls run on a second,
reference set of instances; the turn passes when every public attribute of every reference instance
equals the episode's, and the reference calls' results all appear (as a multiset) among the results the
episode has produced so far. A turn with no reference calls is not checked, as in BFCL. Unlike BFCL,
which stops at the first failing turn, every turn gets a verdict, so `score` is the fraction passed.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from coevolve.services.envs import bfcl_data, hosts
from coevolve.services.envs.host import HostedWorkspace, WorkspaceLost
from coevolve.services.envs.base import Message, StepResult, Task, TurnVerdict
from coevolve.services.envs.calls import Call, CallLimits, Rejected, parse_action
from coevolve.services.envs.tools import InvalidTask, LocalWorkspace, public_methods
from coevolve.services.runtime.config import ConfigError, doc

__all__ = ["BfclConfig", "BfclEnv", "InvalidTask", "public_methods", "reference_problems", "score_calls", "workspace"]


@dataclass(frozen=True)
class BfclConfig:
    """Guards of one BFCL episode."""

    max_steps_per_turn: int = doc(20, "Tool-calling steps allowed in one turn (BFCL's limit is 20).")
    max_steps: int = doc(100, "Tool-calling steps allowed in the whole episode.")
    timeout_s: float = doc(300.0, "Wall-clock limit of one episode, agent's own time included, in seconds.")
    max_action_chars: int = doc(20_000, "Longest agent output accepted, in characters.")
    max_literal_depth: int = doc(16, "Deepest container nesting inside one call argument.")
    max_literal_nodes: int = doc(5_000, "Most literal values in one agent output.")
    tool_docs: str = doc("full", "How the system prompt lists the tools: full (BFCL's JSON function docs) or "
                                 "signatures (one line per function: arguments with types, its description).")

    def __post_init__(self) -> None:
        for name in ("max_steps_per_turn", "max_steps", "max_action_chars", "max_literal_depth",
                     "max_literal_nodes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s={self.timeout_s} must be positive")
        if self.tool_docs not in bfcl_data.TOOL_DOCS:
            raise ConfigError(f"tool_docs={self.tool_docs!r}: choose one of {', '.join(bfcl_data.TOOL_DOCS)}")

    @property
    def limits(self) -> CallLimits:
        return CallLimits(self.max_action_chars, self.max_literal_depth, self.max_literal_nodes)


def workspace(task: Task) -> LocalWorkspace | HostedWorkspace:
    """Fresh instances for `task`: in this thread's tool host when this process bounds its tool calls, else here."""
    tool_host = hosts.installed()
    return HostedWorkspace(tool_host, task) if tool_host else LocalWorkspace(task)


@lru_cache(maxsize=4096)
def _parse_reference(calls: tuple[str, ...]) -> tuple[Call | Rejected, ...]:
    return parse_action(list(calls), CallLimits(max_chars=1 << 20, max_nodes=1 << 20)).calls


class BfclEnv:
    """One BFCL multi-turn episode at a time. Build one per concurrent episode."""

    name = "bfcl"

    def __init__(self, config: BfclConfig | None = None):
        self.config = config or BfclConfig()
        self.task: Task | None = None
        self.done = True
        self.turn = self.steps = 0
        self.terminated: str | None = None
        self._verdicts: list[TurnVerdict] = []

    def reset(self, task: Task) -> list[Message]:
        if not task.turns:
            raise InvalidTask(f"task {task.task_id} has no turns")
        self.task = task
        self.work = workspace(task)
        self.reference = workspace(task) if task.scored else None
        self.turn = 0
        self.steps_in_turn = 0
        self.steps = 0
        self.turn_calls = 0
        self.results: list[str] = []
        self._verdicts: list[TurnVerdict] = []
        self.terminated: str | None = None
        self.started = time.monotonic()
        self.done = False
        tools = bfcl_data.tools_at(task, 0)
        return [{"role": "system", "content": bfcl_data.system_prompt(tools, self.config.tool_docs), "tools": tools},
                {"role": "user", "content": task.turns[0]}]

    def verdicts(self) -> list[TurnVerdict]:
        return list(self._verdicts)

    def tools(self) -> list[dict[str, Any]]:
        """The tools offered at the current turn, as OpenAI-style schemas."""
        return bfcl_data.tools_at(self.task, self.turn) if self.task else []

    @property
    def score(self) -> float:
        if self.task is None or not self.task.scored:
            return 0.0
        return sum(v.passed for v in self._verdicts) / len(self.task.turns)

    @property
    def success(self) -> bool:
        return (self.done and self.terminated is None and self.task is not None and self.task.scored
                and all(v.passed for v in self._verdicts))

    def _result(self, observations: list[Message], **info: Any) -> StepResult:
        info.update(turn=self.turn, steps=self.steps, terminated=self.terminated)
        return StepResult(observations, self.done, self.score, self.success, info)

    def step(self, action: str | Sequence[str | Mapping[str, Any]]) -> StepResult:
        if self.done:
            return self._result([{"role": "system", "content": "The episode is over; call reset."}])
        if time.monotonic() - self.started > self.config.timeout_s:
            return self.terminate(f"time limit of {self.config.timeout_s:g} s reached")
        parsed = parse_action(action, self.config.limits)
        if parsed.ends_turn:
            return self._end_turn()
        if self.steps_in_turn >= self.config.max_steps_per_turn:
            return self.terminate(f"more than {self.config.max_steps_per_turn} tool-calling steps in one turn")
        if self.steps >= self.config.max_steps:
            return self.terminate(f"more than {self.config.max_steps} tool-calling steps in the episode")
        self.steps_in_turn += 1
        self.steps += 1
        observations: list[Message] = []
        for call in parsed.calls:
            if time.monotonic() - self.started > self.config.timeout_s:
                return self.terminate(f"time limit of {self.config.timeout_s:g} s reached", observations)
            try:
                result = self.work.run(call)
            except WorkspaceLost as exc:
                return self.terminate(f"the tool calls' state was lost: {exc}", observations)
            self.results.append(result)
            self.turn_calls += 1
            observations.append({"role": "tool", "name": call.name or "invalid", "content": result})
        return self._result(observations)

    def terminate(self, reason: str, observations: list[Message] | None = None) -> StepResult:
        """End the episode now: the current turn and every later one fail with `reason`."""
        if self.done or self.task is None:
            return self._result(observations or [])
        self.terminated = reason
        if self.task.scored:
            for turn in range(self.turn, len(self.task.turns)):
                why = f"terminated: {reason}" if turn == self.turn else "not reached"
                self._verdicts.append(TurnVerdict(turn, False, why))
        self.done = True
        return self._result((observations or []) + [{"role": "system", "content": f"Episode ended: {reason}."}])

    def _end_turn(self) -> StepResult:
        try:
            verdict = self._check_turn() if self.task.scored else None
        except WorkspaceLost as exc:
            return self.terminate(f"the tool calls' state was lost: {exc}")
        if verdict is not None:
            self._verdicts.append(verdict)
        self.turn += 1
        self.steps_in_turn = 0
        self.turn_calls = 0
        observations: list[Message] = []
        if self.turn == len(self.task.turns):
            self.done = True
        else:
            added = bfcl_data.tools_added_at(self.task, self.turn)
            if added:
                listing = bfcl_data.tool_listing(added, self.config.tool_docs)
                observations.append({"role": "system", "content": f"New functions are available:\n{listing}",
                                     "tools": added})
            observations.append({"role": "user", "content": self.task.turns[self.turn]})
        return self._result(observations, verdict=verdict.to_dict() if verdict else None)

    def _check_turn(self) -> TurnVerdict:
        reference_calls = self.task.reference[self.turn]
        expected = [self.reference.run(call) for call in _parse_reference(reference_calls)]
        if not reference_calls:
            return TurnVerdict(self.turn, True, "no reference calls this turn; not checked")
        if self.turn_calls == 0:
            return TurnVerdict(self.turn, False, "no tool calls in this turn")
        diffs = self.work.state_differences(self.reference)
        missing = list((Counter(expected) - Counter(self.results)).elements())
        details = {"state_differences": diffs, "missing_results": missing}
        if diffs:
            where = ", ".join(f"{cls}.{attr}" for cls, attrs in diffs.items() for attr in attrs)
            return TurnVerdict(self.turn, False, f"state differs from the reference: {where}", details)
        if missing:
            return TurnVerdict(self.turn, False, f"{len(missing)} reference result(s) missing from the "
                                                 f"episode's results", details)
        return TurnVerdict(self.turn, True, "state and results match the reference")


def score_calls(task: Task, turns: Sequence[Sequence[str]], config: BfclConfig | None = None) -> dict[str, Any]:
    """Score a fixed call sequence (per turn, BFCL call strings), the way `coevolve env score` does."""
    if len(turns) > len(task.turns):
        raise ValueError(f"task {task.task_id} has {len(task.turns)} turns, the calls give {len(turns)}")
    env = BfclEnv(config)
    env.reset(task)
    for calls in turns:
        if calls:
            env.step(list(calls))
        env.step("")
    if not env.done:
        env.terminate(f"the calls give {len(turns)} of {len(task.turns)} turns")
    return {"task_id": task.task_id, "success": env.success, "score": env.score,
            "turns": [v.to_dict() for v in env.verdicts()]}


def reference_problems(task: Task) -> list[str]:
    """Why a task's reference cannot stand as its solution: the task does not load, or a reference
    call is rejected, unknown, raises, or returns an error. Empty for a sound task (all BFCL seeds)."""
    try:
        work = workspace(task)
    except InvalidTask as exc:
        return [str(exc)]
    if not task.turns:
        return ["the task has no turns"]
    if not task.reference:
        return ["the task has no reference solution"]
    problems = []
    for turn, calls in enumerate(task.reference):
        for source, call in zip(calls, _parse_reference(tuple(calls))):
            try:
                result = work.run(call)
            except WorkspaceLost as exc:
                return problems + [f"turn {turn}: {source} -> {exc}"]
            try:
                value = json.loads(result)
            except ValueError:
                value = None
            if (result.startswith(("Invalid action", "Error during execution"))
                    or (isinstance(value, dict) and "error" in value)):
                problems.append(f"turn {turn}: {source} -> {result[:200]}")
    return problems
