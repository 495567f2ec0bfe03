"""Abstraction: the LLM turns one group of explorations into a proposed task (JSON schema).

A group is the exploration runs of one signal cluster on one task (`ExplorationRecorded` events). The
prompt shows the seed task, the exploration contexts and the explored calls that succeeded; the model
answers with the user turns, each with its reference calls. By default (`group_schema`) the schema
makes every reference call one of those explored calls and the task keeps the seed's classes and
initial state; free mode lets the model write any call, name the classes and patch the state.
`parse_proposal` checks an answer; `build_task` makes it a `Task` that runs exactly like a seed task.
With `instructions = False` the model only chooses each turn's reference calls and `describe_calls`
writes the instruction from the tools' own descriptions and the calls' arguments: for a model too small
to say what the calls it chose do (SmolLM2-135M wrote "[1]" and "Train 2 (trading_logout())").

`initial_state` is a JSON merge patch (RFC 7386) over the seed task's state, as JSON text: absent or
empty keeps the seed's state, an object changes only the keys it names (null deletes one). Only the
involved classes' states are kept.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Iterable, Mapping, Sequence

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.calls import Call, parse_action
from coevolve.services.explorer.random_strategy import is_error_observation
from coevolve.services.agent.structured import Parsed, clip, parse_structured

_STATE_CHARS = 2000
_OBSERVATION_CHARS = 200
_MAX_CALLS_SHOWN = 60


INSTRUCTION_CHARS = 240
CALL_CHARS = 120
PATCH_CHARS = 1000


def task_schema(max_turns: int = 6, calls: Sequence[str] | None = None, instructions: bool = True,
                max_calls: int = 4) -> dict[str, Any]:
    """The JSON schema of a proposed task, with at most `max_turns` user turns of at most `max_calls`
    reference calls each.

    Every string and array is bounded and each turn carries its own calls, so grammar-constrained
    decoding (vLLM) ends in a complete answer whatever the model: a random-weight one fills each string
    to its bound but cannot run on to the token limit inside one, nor give turns and references of
    different counts. The state patch is JSON text for the same reason: a free JSON object has no bound.

    With `calls` every reference call is one of them (the explored calls that succeeded) and the task
    keeps the seed's classes and initial state, the environment they succeeded in, so neither is asked
    for: constrained decoding cannot then invent a call or pick a class that lacks one. Without
    `instructions` a turn is its reference alone (`describe_calls` writes the instruction).
    """
    reference = {"enum": list(calls)} if calls is not None else {
        "type": "string", "minLength": 1, "maxLength": CALL_CHARS}
    turn: dict[str, Any] = {
        "instruction": {"type": "string", "minLength": 1, "maxLength": INSTRUCTION_CHARS,
                        "description": "The user's message at this turn."},
        "reference": {"type": "array", "minItems": 1, "maxItems": max_calls, "items": reference,
                      "description": "The calls that solve this turn, in BFCL call syntax."},
    }
    if not instructions:
        del turn["instruction"]
    properties: dict[str, Any] = {
        "turns": {"type": "array", "minItems": 1, "maxItems": max_turns, "items": {
            "type": "object", "additionalProperties": False, "required": list(turn), "properties": turn}},
    }
    if calls is not None:
        return {"type": "object", "additionalProperties": False, "required": ["turns"], "properties": properties}
    properties["involved_classes"] = {"type": "array", "minItems": 1, "maxItems": 4,
                                      "items": {"enum": sorted(bfcl_data.DOC_FILES)}}
    properties["initial_state"] = {
        "type": "string", "maxLength": PATCH_CHARS,
        "description": "Optional: a JSON merge patch over the seed task's initial state, as JSON text; "
                       "empty or absent keeps the seed's state."}
    return {"type": "object", "additionalProperties": False, "required": ["involved_classes", "turns"],
            "properties": properties}


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


def group_schema(explorations: Sequence[Mapping[str, Any]], seed: Task, max_turns: int = 6,
                 from_exploration: bool = True, instructions: bool = True, max_calls: int = 4) -> dict[str, Any] | None:
    """The schema of the task proposed from one group: references taken from its explored calls that
    succeeded (`from_exploration`), or free; None when there is no such call to take one from."""
    if not from_exploration:
        return task_schema(max_turns, instructions=instructions, max_calls=max_calls)
    calls = [call for call, _ in successful_calls(explorations)[:_MAX_CALLS_SHOWN]]
    return task_schema(max_turns, calls, instructions, max_calls) if calls else None


def _what_it_does(name: str, classes: Sequence[str]) -> str:
    """A tool's own description, its class preamble dropped, as a clause: "change the current ... folder"."""
    for cls in classes:
        for doc in bfcl_data.function_docs(cls):
            if doc["name"] == name:
                first = bfcl_data.tool_description(doc).split(". ")[0].rstrip(". ")
                return first[:1].lower() + first[1:]
    return f"call {name}"


def describe_calls(calls: Sequence[str], classes: Sequence[str]) -> str:
    """A user instruction for a turn from its reference calls: what each tool does, with the arguments,
    e.g. "Please change the current working directory to the specified folder (folder='document')."."""
    parts = []
    for source in calls:
        parsed = parse_action([source]).calls
        call = parsed[0] if len(parsed) == 1 and isinstance(parsed[0], Call) else None
        if call is None:
            parts.append(f"run {source}")
            continue
        args = ", ".join(f"{k}={v!r}" for k, v in call.kwargs.items())
        parts.append(_what_it_does(call.name, classes) + (f" ({args})" if args else ""))
    return "Please " + ", then ".join(dict.fromkeys(parts)) + "."


def abstraction_messages(explorations: Sequence[Mapping[str, Any]], seed: Task,
                         schema: Mapping[str, Any] | None = None) -> list[dict[str, str]]:
    """The chat messages asking for a proposed task from one exploration group, answering `schema`
    (by default the free `task_schema()`)."""
    contexts = sorted({e["context"] for e in explorations if e.get("context")})
    calls = successful_calls(explorations)[:_MAX_CALLS_SHOWN]
    lines = [f"Seed task {seed.task_id}. Tool classes: {', '.join(seed.involved_classes)}.", "Its user turns:"]
    lines.extend(f"  {i + 1}. {turn}" for i, turn in enumerate(seed.turns))
    lines.append("Its initial state: " + clip(json.dumps(seed.initial_state), _STATE_CHARS))
    lines.extend(f"Exploration context: {c}" for c in contexts)
    lines.append("Explored calls that succeeded, from the initial state:")
    lines.extend(f"  {call} -> {clip(obs, _OBSERVATION_CHARS)}" for call, obs in calls)
    schema = schema or task_schema()
    asks = "instruction" in schema["properties"]["turns"]["items"]["properties"]
    turn = ("has the user's instruction and its reference" if asks else "is its reference") + \
        ": a list of calls in BFCL call syntax, taken from the explored calls that succeeded"
    system = ("You write new training tasks for a tool-using agent from what exploration found. Write a "
              f"task a user would ask, different from the seed task, that the explored calls solve. Each turn "
              f"{turn}. Answer with one JSON object that fits this JSON schema, and nothing else:\n"
              + json.dumps(schema))
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]


def parse_proposal(text: str, schema: Mapping[str, Any] | None = None) -> Parsed:
    """The proposed task in a model answer (checked against `schema`, by default the free
    `task_schema()`), or the precise reason there is none."""
    return parse_structured(text, schema or task_schema())


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


def state_patch(proposal: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The proposal's state patch as an object ({} keeps the seed's state), or {} and why it is unusable."""
    text = (proposal.get("initial_state") or "").strip()
    if not text:
        return {}, ""
    try:
        patch = json.loads(text)
    except ValueError as exc:
        return {}, f"initial_state is not JSON text: {exc}"
    if patch is not None and not isinstance(patch, dict):
        return {}, f"initial_state must be a JSON object (a merge patch), not a JSON {type(patch).__name__}"
    return patch or {}, ""


def build_task(proposal: Mapping[str, Any], seed: Task, task_id: str) -> tuple[Task, str]:
    """The proposal as a runnable task, and why its state patch was unusable ("" when it was used).

    The state is the seed's, patched, for the involved classes only; an unusable patch leaves the
    seed's state and the reason, for the well-formed stage to reject the task with."""
    patch, problem = state_patch(proposal)
    state = merge_patch(dict(seed.initial_state), patch)
    classes = tuple(dict.fromkeys(proposal.get("involved_classes") or seed.involved_classes))
    turns = proposal["turns"]
    task = Task(task_id=task_id, turns=tuple(t.get("instruction") or describe_calls(t["reference"], classes)
                                             for t in turns),
                initial_state={c: state[c] for c in classes if c in state}, involved_classes=classes,
                reference=tuple(tuple(t["reference"]) for t in turns), env=seed.env)
    return task, problem
