"""Reflection: the LLM reads a cluster's evidence and writes the exploration context (JSON schema).

The context says what failed or was unstable (`failure`), where in the environment (`location`: the
tool classes, the tools, and the part of the state), and what to try (`to_try`). It is recorded as JSON
in `ExplorationRecorded.context` and steers the exploration runs. `parse_context` checks a model answer
against the task's `context_schema` (whose classes and tools are the task's), and returns the context or the precise reason.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.explorer.planning import Cluster
from coevolve.services.agent.structured import Parsed, clip, parse_structured

CONTEXT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["failure", "location", "to_try"],
    "properties": {
        "failure": {"type": "string", "minLength": 1, "maxLength": 200,
                    "description": "What failed or was unstable, in one or two sentences."},
        "location": {
            "type": "object", "additionalProperties": False, "required": ["classes", "tools"],
            "properties": {
                "classes": {"type": "array", "minItems": 1, "maxItems": 3,
                            "items": {"type": "string", "minLength": 1, "maxLength": 32}},
                "tools": {"type": "array", "minItems": 1, "maxItems": 4,
                          "items": {"type": "string", "minLength": 1, "maxLength": 32}},
                "state": {"type": "string", "maxLength": 120,
                          "description": "The part of the environment's state involved (a folder, a ticket...)."},
            },
        },
        "to_try": {"type": "array", "minItems": 1, "maxItems": 3,
                   "items": {"type": "string", "minLength": 1, "maxLength": 160},
                   "description": "Concrete things to try in the environment, most promising first."},
    },
}
"""Every string and array is bounded, so grammar-constrained decoding (vLLM) ends in a complete answer
whatever the model: a random-weight one fills each string to its bound but cannot run on inside one."""


def context_schema(task: Task) -> dict[str, Any]:
    """`CONTEXT_SCHEMA` with the location's classes and tools limited to the task's: under a grammar
    (vLLM) even a weak model can only name what exists."""
    tools = sorted(t["function"]["name"] for t in bfcl_data.tools_at(task, len(task.turns) - 1))
    schema = json.loads(json.dumps(CONTEXT_SCHEMA))
    location = schema["properties"]["location"]["properties"]
    location["classes"]["items"] = {"enum": sorted(task.involved_classes)}
    location["tools"]["items"] = {"enum": tools}
    return schema

_KIND_MEANING = {
    "forgetting": "the agent used to solve this task but its latest attempt failed (capability regression)",
    "boundary": "the agent's rollouts of this task at one step both succeeded and failed (unstable decisions)",
    "rare": "an action pattern the agent almost never uses (an exploration blind spot)",
}
_STATE_CHARS = 2000
_OBSERVATION_CHARS = 300
_MAX_ACTIONS = 30

SYSTEM_PROMPT = (
    "You analyse where a tool-using agent fails. You get a weakness signal with its evidence: the task, "
    "the agent's actions and what the environment returned, and the scores. Reflect on what went wrong "
    "and plan how to explore the environment to learn it. Answer with one JSON object that fits this "
    "JSON schema, and nothing else:\n"
)


def _render_action(action: Mapping[str, Any]) -> str:
    observation = clip(str(action.get("observation", "")), _OBSERVATION_CHARS)
    return f"{action.get('name')}({action.get('arguments', '')}) -> {observation}"


def _signal_lines(record: Mapping[str, Any]) -> list[str]:
    kind = record["kind"]
    evidence = record.get("evidence") or {}
    lines = [f"Signal {kind}: {_KIND_MEANING[kind]}. Step {record['step']}, subject {record['subject']}."]
    if evidence.get("scores"):
        lines.append(f"Rollout scores: {', '.join(f'{s:.2f}' for s in evidence['scores'])}.")
    if evidence.get("previous_scores"):
        lines.append(f"Previous attempt scores, oldest first: "
                     f"{', '.join(f'{s:.2f}' for s in evidence['previous_scores'])}.")
    if kind == "rare":
        lines.append(f"Pattern {' > '.join(record.get('pattern') or [])} occurred "
                     f"{evidence.get('pattern_count', 0)} times in {evidence.get('pattern_total', 0)}.")
    for trajectory in evidence.get("trajectories") or []:
        lines.append(f"Rollout {trajectory['rollout_index']} of {trajectory['task_id']} "
                     f"(score {trajectory['score']:.2f}):")
        actions = trajectory.get("actions") or []
        lines.extend(f"  {_render_action(a)}" for a in actions[:_MAX_ACTIONS])
        if len(actions) > _MAX_ACTIONS:
            lines.append(f"  ... {len(actions) - _MAX_ACTIONS} more actions")
    return lines


def _task_lines(task: Task) -> list[str]:
    tools = [t["function"]["name"] for t in bfcl_data.tools_at(task, len(task.turns) - 1)]
    lines = [f"Task {task.task_id}. Tool classes: {', '.join(task.involved_classes)}.",
             f"Tools: {', '.join(tools)}.", "User turns:"]
    lines.extend(f"  {i + 1}. {turn}" for i, turn in enumerate(task.turns))
    lines.append("Initial state: " + clip(json.dumps(task.initial_state), _STATE_CHARS))
    return lines


def reflection_messages(cluster: Cluster, task: Task) -> list[dict[str, str]]:
    """The chat messages asking for the exploration context of one cluster on its task."""
    lines = _task_lines(task) + [""]
    for signal in cluster.signals:
        lines.extend(_signal_lines(signal.record))
    return [{"role": "system", "content": SYSTEM_PROMPT + json.dumps(context_schema(task))},
            {"role": "user", "content": "\n".join(lines)}]


def parse_context(text: str, task: Task) -> Parsed:
    """The exploration context in a model answer, checked against the task's `context_schema`."""
    return parse_structured(text, context_schema(task))
