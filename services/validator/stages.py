"""The validation stages a proposed task goes through, in order; each returns its outcome and reason.

1. `well_formed`: the task has turns, every turn has reference calls, every reference call parses as
   one plain call with literal arguments, and names a public tool of an involved class, no instruction
   spells out a call (`wording.leaked_call`), and the initial state loads into those classes (so no
   task that cannot start, or that only asks to copy a call, reaches the learner, even with validation
   off).
2. `executable`: from the initial state, the reference runs with no call rejected, raising or
   returning an error, and it changes the state or returns information (a hallucinated task fails).
3. `novel`: not a near-duplicate of a known task (`novelty.py`).
4. `dual_pass`: the attempts' calls, scored against the reference in the real environment: the task is
   kept when one succeeds or earns a positive partial score (the paper's rule); all zero rejects it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import InvalidTask, public_methods, reference_problems, score_calls, workspace
from coevolve.services.envs.host import WorkspaceLost
from coevolve.services.envs.calls import CallLimits, Rejected, parse_action
from coevolve.services.validator.wording import leaked_call

STAGES = ("well_formed", "executable", "novel", "dual_pass")
_EMPTY_RESULTS = frozenset({"", "None", "{}", "[]", "null"})


@dataclass(frozen=True)
class StageOutcome:
    """One stage's result, as recorded in `TaskChecked.stages`."""

    stage: str
    passed: bool
    reason: str

    def to_record(self) -> dict:
        return {"stage": self.stage, "passed": self.passed, "reason": self.reason}


def _tools(task: Task) -> dict[str, str] | str:
    """Tool name to class, or why the classes are not known."""
    owner: dict[str, str] = {}
    for name in task.involved_classes:
        try:
            for method in public_methods(name):
                owner[method] = name
        except InvalidTask as exc:
            return str(exc)
    return owner


def _malformed(reason: str) -> StageOutcome:
    return StageOutcome("well_formed", False, reason)


def check_well_formed(task: Task) -> StageOutcome:
    """Stage 1: every reference call parses and names a tool of the involved classes."""
    if not task.turns:
        return _malformed("the task has no user turns")
    if len(task.reference) != len(task.turns) or not all(task.reference):
        return _malformed("every user turn needs at least one reference call")
    owner = _tools(task)
    if isinstance(owner, str):
        return _malformed(owner)
    try:
        workspace(task)
    except InvalidTask as exc:
        return _malformed(str(exc))
    count = 0
    for turn, calls in enumerate(task.reference):
        for source in calls:
            parsed = parse_action([source], CallLimits(max_chars=1 << 16)).calls
            call = parsed[0] if len(parsed) == 1 else None
            if call is None or isinstance(call, Rejected):
                why = call.reason if isinstance(call, Rejected) else "not one call"
                return _malformed(f"turn {turn}: {source!r} does not parse as one call: {why}")
            if call.name not in owner:
                return _malformed(f"turn {turn}: {call.name!r} is not a tool of "
                            f"{', '.join(task.involved_classes)}")
            count += 1
    for turn, instruction in enumerate(task.turns):
        leak = leaked_call(instruction, owner)
        if leak:
            return _malformed(f"turn {turn}'s instruction: {leak}")
    return StageOutcome("well_formed", True, f"{count} reference call(s) parse and name tools of "
                                             f"{', '.join(task.involved_classes)}")


def _effect(task: Task) -> tuple[bool, bool]:
    """Whether running the whole reference changes the state, and whether any call returns information."""
    work, untouched = workspace(task), workspace(task)
    informative = False
    for calls in task.reference:
        for source in calls:
            result = work.run(parse_action([source], CallLimits(max_chars=1 << 16)).calls[0])
            informative = informative or result.strip() not in _EMPTY_RESULTS
    return bool(work.state_differences(untouched)), informative


def check_executable(task: Task) -> StageOutcome:
    """Stage 2: the reference runs without errors and changes state or returns information."""
    problems = reference_problems(task)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return StageOutcome("executable", False, f"the reference fails: {problems[0]}{more}")
    try:
        changed, informative = _effect(task)
    except (InvalidTask, WorkspaceLost) as exc:
        return StageOutcome("executable", False, f"the reference does not run again: {exc}")
    if not (changed or informative):
        return StageOutcome("executable", False, "the reference changes no state and returns no information")
    what = " and ".join(w for w, yes in (("changes the state", changed), ("returns information", informative)) if yes)
    return StageOutcome("executable", True, f"the reference runs without errors and {what}")


def _score(task: Task, attempt: Sequence[Sequence[str]]) -> dict | str:
    """One attempt's calls per turn scored in the environment, or why the task does not run."""
    try:
        return score_calls(task, [list(turn) for turn in attempt[:len(task.turns)]])
    except InvalidTask as exc:
        return f"the task does not run: {exc}"


def check_dual_pass(task: Task, attempts: Sequence[Sequence[Sequence[str]]]) -> tuple[StageOutcome, float]:
    """Stage 4: each attempt's calls per turn, scored in the environment; the task passes when any attempt
    succeeds or earns a positive partial score. The reason gives the best attempt and every score."""
    results = [_score(task, attempt) for attempt in attempts]
    problem = next((r for r in results if isinstance(r, str)), None)
    if problem is not None or not results:
        return StageOutcome("dual_pass", False, problem or "no attempt was made"), 0.0
    best = max(results, key=lambda r: (bool(r["success"]), float(r["score"])))
    score, passed = float(best["score"]), sum(t["passed"] for t in best["turns"])
    summary = f"attempt scored {score:.2f} ({passed} of {len(task.turns)} turns passed)"
    if len(results) > 1:
        scores = ", ".join(f"{float(r['score']):.2f}" for r in results)
        summary = (f"best of {len(results)} attempts scored {score:.2f} ({passed} of {len(task.turns)} turns "
                   f"passed; scores {scores})")
    if best["success"]:
        return StageOutcome("dual_pass", True, f"{summary}: the attempt completes the task"), score
    if score > 0:
        return StageOutcome("dual_pass", True, f"{summary}: a positive partial score"), score
    first = next((t for t in best["turns"] if not t["passed"]), None)
    detail = f"; turn {first['turn']}: {first['reason']}" if first else ""
    return StageOutcome("dual_pass", False, f"{summary}{detail}"), score
