"""`coevolve env score` and `coevolve env show`: score call sequences and print tasks, for debugging."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, TextIO

from coevolve.services.envs import ENVIRONMENTS, bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import score_calls


class CommandError(ValueError):
    """Bad input to an env command; the message says what to fix."""


def _check_env(env: str) -> None:
    if env not in ENVIRONMENTS:
        raise CommandError(f"unknown environment {env!r}; available: {', '.join(ENVIRONMENTS)}")


def _task(task_id: str) -> Task:
    try:
        return bfcl_data.get_task(task_id)
    except KeyError as exc:
        raise CommandError(exc.args[0]) from None


def _turns(value: Any, where: str) -> list[list[str]]:
    if not (isinstance(value, list) and all(isinstance(t, list) and all(isinstance(c, str) for c in t)
                                            for t in value)):
        raise CommandError(f"{where}: expected a JSON list of turns, each a list of call strings, "
                           "e.g. [[\"cd(folder='document')\", \"ls()\"], []]")
    return value


def score_one(env: str, task_id: str, calls_path: Path) -> dict[str, Any]:
    _check_env(env)
    try:
        calls = json.loads(calls_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CommandError(f"cannot read {calls_path}: {exc}") from None
    try:
        return score_calls(_task(task_id), _turns(calls, str(calls_path)))
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def score_lines(env: str, lines: TextIO) -> Iterator[dict[str, Any]]:
    """One result per input line, in order; a bad line yields `{"task_id", "error"}` instead."""
    _check_env(env)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        task_id = None
        try:
            item = json.loads(line)
            if not isinstance(item, dict) or "task_id" not in item or "calls" not in item:
                raise CommandError("expected an object with task_id and calls")
            task_id = item["task_id"]
            yield score_calls(_task(str(task_id)), _turns(item["calls"], f"line {number}"))
        except (ValueError, CommandError) as exc:
            yield {"task_id": task_id, "error": f"line {number}: {exc}"}


def score_batch(env: str, source: Path, output: TextIO) -> int:
    count = 0
    try:
        with source.open(encoding="utf-8") as lines:
            for result in score_lines(env, lines):
                output.write(json.dumps(result) + "\n")
                count += 1
    except OSError as exc:
        raise CommandError(f"cannot read {source}: {exc}") from None
    return count


def describe(env: str, task_id: str) -> str:
    """The task, its tools and its reference, as readable text."""
    _check_env(env)
    task = _task(task_id)
    lines = [f"{task.task_id}  (category {bfcl_data.category_of(task.task_id)}, "
             f"split {bfcl_data.split_of(task.task_id)}, {len(task.turns)} turns)",
             f"classes: {', '.join(task.involved_classes)}"]
    withheld = {name: turn for turn, names in task.added_tools.items() for name in names}
    lines.append("tools:")
    for cls in task.involved_classes:
        names = [d["name"] + (f" (from turn {withheld[d['name']]})" if d["name"] in withheld else "")
                 for d in bfcl_data.function_docs(cls)]
        lines.append(f"  {cls}: {', '.join(names)}")
    for turn, text in enumerate(task.turns):
        lines.append(f"turn {turn}:")
        lines.append(f"  user: {text}")
        reference = task.reference[turn] if task.reference else ()
        lines.append("  reference:" + ("" if reference else " (no calls)"))
        lines.extend(f"    {call}" for call in reference)
    lines.append("initial state:")
    lines.extend("  " + row for row in json.dumps(task.initial_state, indent=2).splitlines())
    return "\n".join(lines)


def describe_json(env: str, task_id: str) -> dict[str, Any]:
    _check_env(env)
    task = _task(task_id)
    record = task.to_record()
    record["initial_state"] = task.initial_state
    record["added_tools"] = {str(k): list(v) for k, v in task.added_tools.items()}
    record["split"] = bfcl_data.split_of(task.task_id)
    record["tools"] = [t["function"]["name"] for t in bfcl_data.tools_at(task, len(task.turns) - 1)]
    return record
