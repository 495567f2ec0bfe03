"""The shape of a run's tasks: reference calls and user turns per validated task against the seed pool's,
and the instructions that spell out a call (a synthesized task says what to achieve; a model trained to
copy a call out of its prompt learns nothing BFCL's users would ask)."""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from coevolve.services.envs.base import Task
from coevolve.services.envs.tools import InvalidTask, public_methods
from coevolve.services.validator.wording import leaked_call


def _tools(classes: Iterable[str]) -> set[str]:
    tools: set[str] = set()
    for cls in classes:
        try:
            tools |= public_methods(cls)
        except InvalidTask:
            continue
    return tools


def _shape(rows: Sequence[tuple[Sequence[str], Sequence[Sequence[str]], Sequence[str]]]) -> dict[str, Any]:
    """Counts over (turns, reference per turn, classes) rows."""
    calls = [sum(len(turn) for turn in reference) for _, reference, _ in rows]
    turns = [len(t) for t, _, _ in rows]
    leaked = sum(bool(leaked_call(text, _tools(classes))) for t, _, classes in rows for text in t)
    n = len(rows)
    return {"tasks": n, "calls": dict(sorted(Counter(calls).items())), "turns": dict(sorted(Counter(turns).items())),
            "mean_calls": sum(calls) / n if n else None, "mean_turns": sum(turns) / n if n else None,
            "two_or_more_calls": sum(c >= 2 for c in calls), "instructions": sum(turns),
            "instructions_leaking_a_call": leaked}


def task_shape(validated: Iterable[Mapping[str, Any]], seeds: Iterable[Task]) -> dict[str, Any]:
    """Calls and turns per task of the run's validated tasks (`TaskChecked` records) and of its seeds."""
    return {"validated": _shape([(v.get("instruction_turns") or (), v.get("reference_solution") or (),
                                  v.get("involved_classes") or ()) for v in validated]),
            "seeds": _shape([(t.turns, t.reference, t.involved_classes) for t in seeds])}


def shape_line(shape: Mapping[str, Any]) -> str:
    """The terminal's line on it: `task shape: validated 4, 2.5 calls and 2.0 turns each (3 with 2+ calls),
    instructions leaking a call 0 of 8; seeds 16, 9.8 calls and 4.4 turns each`."""
    v, s = shape["validated"], shape["seeds"]
    line = f"task shape: validated {v['tasks']}"
    if v["tasks"]:
        line += (f", {v['mean_calls']:.1f} calls and {v['mean_turns']:.1f} turns each ({v['two_or_more_calls']} "
                 f"with 2+ calls), instructions leaking a call {v['instructions_leaking_a_call']} of "
                 f"{v['instructions']}")
    if s["tasks"]:
        line += f"; seeds {s['tasks']}, {s['mean_calls']:.1f} calls and {s['mean_turns']:.1f} turns each"
    return line
