"""Abstraction: the LLM turns one group of explorations into a proposed task (JSON schema).

A group is the exploration runs of one signal cluster on one task (`ExplorationRecorded` events). The
prompt shows the seed task, the exploration contexts and the explored calls that succeeded; the model
answers with the user turns, each with its reference calls. By default (`group_schema`) the schema
makes every reference call one of those explored calls and the task keeps the seed's classes and
initial state; free mode lets the model write any call, name the classes and patch the state.
`parse_proposal` checks an answer; `build_task` makes it a `Task` that runs exactly like a seed task.
For a model too small to write a task (`instructions: calls`), `chain_proposal` takes the group's
longest chain of explored calls that worked, in the order they ran, as the reference, and `build_task`
writes each turn's instruction from the tools' own descriptions (`wording.py`).

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
from coevolve.services.envs.calls import Call
from coevolve.services.explorer.random_strategy import is_error_observation
from coevolve.services.agent.structured import Parsed, clip, parse_structured
from coevolve.services.validator.wording import describe_turn

_STATE_CHARS = 2000
_OBSERVATION_CHARS = 200
_MAX_CALLS_SHOWN = 60


INSTRUCTION_CHARS = 240
CALL_CHARS = 120
PATCH_CHARS = 1000


def task_schema(max_turns: int = 6, calls: Sequence[str] | None = None, max_calls: int = 4) -> dict[str, Any]:
    """The JSON schema of a proposed task, with at most `max_turns` user turns of at most `max_calls`
    reference calls each.

    Every string and array is bounded and each turn carries its own calls, so grammar-constrained
    decoding (vLLM) ends in a complete answer whatever the model: a random-weight one fills each string
    to its bound but cannot run on to the token limit inside one, nor give turns and references of
    different counts. The state patch is JSON text for the same reason: a free JSON object has no bound.

    With `calls` every reference call is one of them (the explored calls that succeeded) and the task
    keeps the seed's classes and initial state, the environment they succeeded in, so neither is asked
    for: constrained decoding cannot then invent a call or pick a class that lacks one.
    """
    reference = {"enum": list(calls)} if calls is not None else {
        "type": "string", "minLength": 1, "maxLength": CALL_CHARS}
    turn: dict[str, Any] = {
        "instruction": {"type": "string", "minLength": 1, "maxLength": INSTRUCTION_CHARS,
                        "description": "The user's message at this turn."},
        "reference": {"type": "array", "minItems": 1, "maxItems": max_calls, "items": reference,
                      "description": "The calls that solve this turn, in BFCL call syntax."},
    }
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
                 from_exploration: bool = True, max_calls: int = 4) -> dict[str, Any] | None:
    """The schema of the task proposed from one group: references taken from its explored calls that
    succeeded (`from_exploration`), or free; None when there is no such call to take one from."""
    if not from_exploration:
        return task_schema(max_turns, max_calls=max_calls)
    calls = [call for call, _ in successful_calls(explorations)[:_MAX_CALLS_SHOWN]]
    return task_schema(max_turns, calls, max_calls) if calls else None


def explored_chains(explorations: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """Per exploration run (in round order), its calls that worked, in the order they ran. Each run starts
    from the task's initial state, and BFCL's backends check a call before they change anything, so a
    chain replays from that state with each call seeing what the calls before it made (cd, then ls
    there); the executable stage replays it and rejects one that does not. A call repeated at once is
    kept once."""
    chains = []
    for event in sorted(explorations, key=lambda e: int(e.get("round") or 0)):
        chain: list[str] = []
        for item in event["tuples"]:
            call = render_tuple(item)
            if is_error_observation(item["observation"]) or call.endswith("(<unreadable arguments>)"):
                continue
            if not chain or chain[-1] != call:
                chain.append(call)
        if chain:
            chains.append(chain)
    return chains


def split_turns(calls: Sequence[str], max_turns: int) -> list[list[str]]:
    """`calls` as at most `max_turns` user turns, in order, each as even as can be (earlier ones longer)."""
    turns = min(max_turns, len(calls))
    size, extra = divmod(len(calls), turns) if turns else (0, 0)
    out, at = [], 0
    for i in range(turns):
        n = size + (i < extra)
        out.append(list(calls[at:at + n]))
        at += n
    return out


def chain_proposal(explorations: Sequence[Mapping[str, Any]], max_turns: int, calls_per_turn: int) -> dict | None:
    """The group's longest chain (`explored_chains`; the earliest run among equals), cut to `max_turns` x
    `calls_per_turn` calls, as a proposal of user turns with their reference calls and no instruction
    (`build_task` writes it from the tools' descriptions); None when no explored call worked."""
    chains = explored_chains(explorations)
    if not chains:
        return None
    chain = max(chains, key=len)[:max_turns * calls_per_turn]
    return {"turns": [{"reference": turn} for turn in split_turns(chain, max_turns)]}


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
    lines.append("Each run's calls that succeeded, in the order they ran (a later call sees what earlier ones did):")
    lines.extend(f"  run {i + 1}: " + ", then ".join(chain) for i, chain in enumerate(explored_chains(explorations)))
    schema = schema or task_schema()
    system = ("You write new training tasks for a tool-using agent from what exploration found. Write a "
              "task a user would ask, different from the seed task, that the explored calls solve in the order "
              "they ran. Each turn has the user's instruction and its reference: a list of calls in BFCL call "
              "syntax, taken from the explored calls that succeeded. An instruction says what to achieve, with "
              "the values a user would give, never a call or name=value. Answer with one JSON object that fits "
              "this JSON schema, and nothing else:\n" + json.dumps(schema))
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
    task = Task(task_id=task_id, turns=tuple(t.get("instruction") or describe_turn(t["reference"], classes)
                                             for t in turns),
                initial_state={c: state[c] for c in classes if c in state}, involved_classes=classes,
                reference=tuple(tuple(t["reference"]) for t in turns), env=seed.env)
    return task, problem
