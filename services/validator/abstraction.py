"""Abstraction: the LLM turns one group of explorations into a proposed task (JSON schema).

A group is the exploration runs of one signal cluster on one task (`ExplorationRecorded` events). The
prompt shows the seed task, the exploration contexts and the explored calls that succeeded; the model
answers with user turns, the involved classes, optionally a change to the seed's initial state, and
per turn the reference calls taken from those explored calls. `parse_proposal` checks the answer;
`build_task` makes it a `Task` that runs exactly like a seed task.

`initial_state` is a JSON merge patch (RFC 7386) over the seed task's state: absent or null keeps the
seed's state, an object changes only the keys it names (null deletes one). Only the involved classes'
states are kept.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Iterable, Mapping, Sequence

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.calls import Call
from coevolve.services.explorer.random_strategy import is_error_observation
from coevolve.services.agent.structured import Parsed, clip, parse_structured

_STATE_CHARS = 2000
_OBSERVATION_CHARS = 200
_MAX_CALLS_SHOWN = 60


def task_schema(max_turns: int = 6) -> dict[str, Any]:
    """The JSON schema of a proposed task, with at most `max_turns` user turns."""
    turns = {"type": "array", "minItems": 1, "maxItems": max_turns}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["turns", "involved_classes", "reference"],
        "properties": {
            "turns": {**turns, "items": {"type": "string", "minLength": 1, "maxLength": 2000},
                      "description": "The user's message at each turn."},
            "involved_classes": {"type": "array", "minItems": 1, "uniqueItems": True,
                                 "items": {"enum": sorted(bfcl_data.DOC_FILES)}},
            "initial_state": {"type": ["object", "null"],
                              "description": "Merge patch over the seed task's initial state; null keeps it."},
            "reference": {**turns, "items": {"type": "array", "minItems": 1,
                                             "items": {"type": "string", "minLength": 1}},
                          "description": "Per turn, the calls that solve it, in BFCL call syntax."},
        },
    }


def render_tuple(item: Mapping[str, Any]) -> str:
    """An exploration tuple's call in BFCL call syntax, e.g. `cd(folder='document')`."""
    try:
        arguments = json.loads(item["arguments"]) if item["arguments"] else {}
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        return f"{item['name']}(<unreadable arguments>)"
    return Call(item["name"], (), arguments).render()


def successful_calls(explorations: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(call, observation) of every explored call that did not fail, first occurrence of each call."""
    seen: dict[str, str] = {}
    for event in explorations:
        for item in event["tuples"]:
            if not is_error_observation(item["observation"]):
                seen.setdefault(render_tuple(item), item["observation"])
    return list(seen.items())


def abstraction_messages(explorations: Sequence[Mapping[str, Any]], seed: Task,
                         max_turns: int = 6) -> list[dict[str, str]]:
    """The chat messages asking for a proposed task from one exploration group."""
    contexts = sorted({e["context"] for e in explorations if e.get("context")})
    calls = successful_calls(explorations)[:_MAX_CALLS_SHOWN]
    lines = [f"Seed task {seed.task_id}. Tool classes: {', '.join(seed.involved_classes)}.", "Its user turns:"]
    lines.extend(f"  {i + 1}. {turn}" for i, turn in enumerate(seed.turns))
    lines.append("Its initial state: " + clip(json.dumps(seed.initial_state, sort_keys=True), _STATE_CHARS))
    lines.extend(f"Exploration context: {c}" for c in contexts)
    lines.append("Explored calls that succeeded, from the initial state:")
    lines.extend(f"  {call} -> {clip(obs, _OBSERVATION_CHARS)}" for call, obs in calls)
    system = ("You write new training tasks for a tool-using agent from what exploration found. Write a "
              "task a user would ask, different from the seed task, that the explored calls solve. Each "
              "turn's reference is a list of calls in BFCL call syntax, taken from the explored calls "
              "that succeeded. Answer with one JSON object that fits this JSON schema, and nothing "
              "else:\n" + json.dumps(task_schema(max_turns)))
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]


def _check_turns(value: dict[str, Any]) -> str | None:
    if len(value["reference"]) != len(value["turns"]):
        return (f"'reference' has {len(value['reference'])} turn(s) but 'turns' has {len(value['turns'])}; "
                "give one list of calls per user turn")
    return None


def parse_proposal(text: str, max_turns: int = 6) -> Parsed:
    """The proposed task in a model answer, or the precise reason there is none."""
    return parse_structured(text, task_schema(max_turns), _check_turns)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; neither argument is modified."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def synthesized_task_id(exploration_ids: Iterable[str]) -> str:
    """The id of the task proposed from these explorations: the same group always gives the same id."""
    digest = hashlib.sha256(json.dumps(sorted(exploration_ids)).encode()).hexdigest()[:16]
    return f"synthesized_{digest}"


def build_task(proposal: Mapping[str, Any], seed: Task, task_id: str) -> Task:
    """The proposal as a runnable task; its state is the seed's, patched, for the involved classes only."""
    state = merge_patch(dict(seed.initial_state), proposal.get("initial_state") or {})
    classes = tuple(proposal["involved_classes"])
    return Task(task_id=task_id, turns=tuple(proposal["turns"]),
                initial_state={c: state[c] for c in classes if c in state}, involved_classes=classes,
                reference=tuple(tuple(turn) for turn in proposal["reference"]), env=seed.env)
