"""Run the validation stages in order and turn the verdict into a `TaskChecked` event.

The stages stop at the first rejection, so attempts (the validator agent's model runs, passed in as
`attempt`) are only made for a task that is well-formed, executable and novel. A validated task joins
the novelty index, so a later proposal of the same task is a duplicate. With `validation` off (the
paper's no-validation ablation) only the well-formed stage runs: a task whose calls do not parse
could not be scored at all.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from coevolve.services.envs.base import Task
from coevolve.services.validator.abstraction import render_tuple
from coevolve.services.validator.config import ValidatorConfig
from coevolve.services.validator.novelty import NoveltyIndex
from coevolve.services.validator.stages import (StageOutcome, check_dual_pass, check_executable,
                                                check_well_formed)

Attempt = Callable[[Task], Sequence[Sequence[Sequence[str]]]]
"""Given a task, the agent's attempts at it: each the calls it made per user turn (BFCL call strings)."""

NO_VALIDATION = "validation disabled (--no-validation): only well-formedness checked"


@dataclass(frozen=True)
class Verdict:
    """A proposed task, the stages it went through, and whether it is kept."""

    task: Task
    validated: bool
    stages: tuple[StageOutcome, ...]
    score: float | None = None
    """The best dual-pass attempt's score, when attempts were made."""

    @property
    def stage(self) -> str | None:
        """The stage that rejected the task; None when validated."""
        return None if self.validated else self.stages[-1].stage

    @property
    def reason(self) -> str:
        if not self.validated:
            return f"{self.stages[-1].stage}: {self.stages[-1].reason}"
        if self.stages[-1].stage == "well_formed":
            return NO_VALIDATION
        return f"passed {', '.join(s.stage for s in self.stages)}; {self.stages[-1].reason}"


def attempt_calls(actions: Sequence[dict[str, Any]], turns: int) -> list[list[str]]:
    """Per user turn, an episode's calls in BFCL call syntax, from `TrajectoryRecorded`-shaped actions
    (name, JSON arguments, turn): what `check_dual_pass` scores."""
    calls: list[list[str]] = [[] for _ in range(turns)]
    for action in actions:
        turn = int(action.get("turn", 0))
        if 0 <= turn < turns:
            calls[turn].append(render_tuple(action))
    return calls


def validate(task: Task, index: NoveltyIndex, attempt: Attempt, config: ValidatorConfig) -> Verdict:
    """Check `task` stage by stage; a validated task is added to `index`."""
    stages = [check_well_formed(task)]
    if not stages[-1].passed:
        return Verdict(task, False, tuple(stages))
    if not config.validation:
        return Verdict(task, True, tuple(stages))
    for check in (check_executable, index.check):
        stages.append(check(task))
        if not stages[-1].passed:
            return Verdict(task, False, tuple(stages))
    outcome, score = check_dual_pass(task, attempt(task))
    stages.append(outcome)
    if outcome.passed:
        index.add(task)
    return Verdict(task, outcome.passed, tuple(stages), score)


def verdict_id(task_id: str, verdict: str) -> str:
    """The `TaskChecked.event_id` of `verdict` ("validated" or "rejected") on `task_id`."""
    return hashlib.sha256(json.dumps(["verdict", task_id, verdict]).encode()).hexdigest()[:32]


def verdict_record(verdict: Verdict, run_id: str, step: int, seed_task_id: str | None,
                   signal_ids: Sequence[str], exploration_ids: Sequence[str],
                   produced_at: int) -> dict[str, Any]:
    """The verdict as a `TaskChecked` event. Its id is the task's and the verdict's alone (not the reason's
    text, which counts the known tasks), so the archive keeps one row for a verdict published twice."""
    body = {**verdict.task.to_record(), "verdict": "validated" if verdict.validated else "rejected",
            "reason": verdict.reason, "stage": verdict.stage,
            "stages": [s.to_record() for s in verdict.stages]}
    event_id = verdict_id(verdict.task.task_id, body["verdict"])
    return {"event_id": event_id, "run_id": run_id, "step": int(step), "source": "synthesized", **body,
            "signal_ids": list(signal_ids), "exploration_ids": list(exploration_ids),
            "validation_score": verdict.score, "seed_task_id": seed_task_id, "produced_at": int(produced_at)}
