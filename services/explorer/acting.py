"""Exploration runs the model acts in: one schema-constrained call at a time, each result read back.

A run starts from its task's initial state in a fresh environment; a signal's run may first replay the
failing rollout's calls up to where it went wrong (`Start.prefix`), so the model begins at the failure.
Then, up to S times, the model writes the next call: one JSON object that `call_schema` limits to the
task's tools, with each tool's own argument names and types; a signal's first call is limited to the
tools of its weak spot (`Start.first`). On vLLM (in-process or `vllm serve`) and
on OpenAI-compatible servers that honour `response_format` the grammar makes every call valid by
construction; the transformers backend cannot constrain decoding, so its answers are checked against
the same schema and sampled again (`generate_json`), and a run whose answers never fit ends there.

The R runs of every task of a period step together: each round sends one batched request per live
run, so vLLM serves their shared prompts from its cache. The prompt holds the task's request, the
guidance (a signal's reflection context, or none for unguided exploration) and every call made so
far with what it returned. String arguments are left to the model: constraining them to the values
the episode had revealed halved the calls that succeeded (docs/explorer-validator.md).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.structured import StructuredOutputError, clip, generate_json
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import BfclConfig, BfclEnv
from coevolve.services.explorer.random_strategy import ExplorationRun, ExploredCall, is_error_observation

STRING_CHARS = 80
ARRAY_ITEMS = 4
_OBSERVATION_CHARS = 240
_STATE_CHARS = 1200
RUN_SECONDS = 3600.0
"""An environment's wall-clock limit per run: each call waits on the whole batch's generation (BFCL's
300 s per episode ended runs of a 16-run batch on a busy CPU); `max_seconds_per_period` bounds a period."""

SYSTEM_PROMPT = (
    "You explore a software environment through its functions, one call at a time, to learn how its "
    "tools behave. After each call you see what it returned. Answer with the next call only, as one "
    "JSON object {\"name\": <function>, \"arguments\": {...}}.\n\nFunctions:\n"
)


def _argument_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tool parameter's schema, bounded so constrained decoding always ends: strings and arrays get a
    length limit, objects take only their named properties."""
    kind = schema.get("type")
    out: dict[str, Any] = {"type": kind} if kind else {}
    if "enum" in schema:
        out["enum"] = list(schema["enum"])
    if kind == "string" and "enum" not in schema:
        out["maxLength"] = STRING_CHARS
    if kind == "array":
        out["items"] = _argument_schema(schema.get("items") or {"type": "string"})
        out["maxItems"] = ARRAY_ITEMS
    if kind == "object":
        properties = schema.get("properties") or {}
        out["properties"] = {name: _argument_schema(p) for name, p in properties.items()}
        out["required"] = [r for r in schema.get("required") or () if r in properties]
        out["additionalProperties"] = False
    return out


def call_schema(tools: Sequence[Mapping[str, Any]], first: Sequence[str] = ()) -> dict[str, Any]:
    """One call of one of `tools`: `{"name": <tool>, "arguments": <its parameters>}`; the tools named in
    `first` (the reflection's location) are listed first."""
    order = {name: i for i, name in enumerate(first)}
    ranked = sorted(tools, key=lambda t: (order.get(t["function"]["name"], len(order)), t["function"]["name"]))
    options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": t["function"]["name"]},
                               "arguments": _argument_schema(t["function"].get("parameters")
                                                             or {"type": "object"})}}
               for t in ranked]
    return {"anyOf": options} if len(options) > 1 else options[0]


@dataclass(frozen=True)
class Start:
    """Where one exploration run begins and what guides it."""

    task: Task
    round: int
    guidance: tuple[str, ...] = ()
    """Lines shown before the calls (a signal's reflection context); empty for unguided exploration."""
    focus: tuple[str, ...] = ()
    """Tools the guidance points at, listed first in the prompt and the call schema."""
    prefix: tuple[Mapping[str, Any], ...] = ()
    """Calls replayed before the model acts (name, JSON arguments): a failing rollout's, up to its failure."""
    first: tuple[str, ...] = ()
    """Tools the model's first call must use (a rare pattern's calls, the call where a rollout failed);
    empty: any of the task's tools."""


@dataclass
class _Run:
    start: Start
    env: BfclEnv
    tools: list[dict[str, Any]]
    schema: dict[str, Any]
    tool_docs: str = "signatures"
    opening: dict[str, Any] | None = None
    """The first model call's schema, when `Start.first` names tools of the task."""
    calls: list[ExploredCall] = field(default_factory=list)
    replayed: int = 0
    done: bool = False


def replay_prefix(actions: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """A rollout's calls before its first failing one (the point where it went wrong); calls made with
    positional arguments cannot be re-made as JSON calls, so the prefix stops there too."""
    prefix = []
    for action in actions:
        if is_error_observation(str(action.get("observation", ""))):
            break
        try:
            arguments = json.loads(action.get("arguments") or "{}")
        except ValueError:
            break
        if not isinstance(arguments, dict) or "args" in arguments:
            break
        prefix.append({"name": str(action["name"]), "arguments": arguments})
    return tuple(prefix)


def _open(start: Start, calls: int, tool_docs: str) -> _Run:
    unscored = dataclasses.replace(start.task, reference=())
    steps = calls + len(start.prefix)
    env = BfclEnv(BfclConfig(max_steps_per_turn=steps, max_steps=steps, timeout_s=RUN_SECONDS))
    env.reset(unscored)
    tools = bfcl_data.tools_at(start.task, len(start.task.turns) - 1)
    focus = [name for name in start.focus if any(t["function"]["name"] == name for t in tools)]
    opening = [t for t in tools if t["function"]["name"] in start.first]
    run = _Run(start, env, tools, call_schema(tools, focus), tool_docs, call_schema(opening) if opening else None)
    for call in start.prefix:
        _execute(run, call["name"], dict(call["arguments"]))
        run.replayed += 1
        if run.done or is_error_observation(run.calls[-1].observation):
            break  # the environment moved on since the rollout: explore from here
    return run


def _execute(run: _Run, name: str, arguments: dict[str, Any]) -> None:
    result = run.env.step([{"name": name, "arguments": arguments}])
    observation = next((o["content"] for o in result.observations if o.get("role") == "tool"),
                       result.observations[0]["content"] if result.observations else "")
    run.calls.append(ExploredCall(name, arguments, observation))
    run.done = result.done
    if not is_error_observation(observation):
        _drop_answered(run, name)


def _drop_answered(run: _Run, name: str) -> None:
    """A tool without parameters that has answered once would only answer the same again (SmolLM2 called
    `list_all_following()` four times in a row): it is no longer offered in this run."""
    tool = next((t for t in run.tools if t["function"]["name"] == name), None)
    if tool is None or (tool["function"].get("parameters") or {}).get("properties") or len(run.tools) < 2:
        return
    run.tools = [t for t in run.tools if t is not tool]
    run.schema = call_schema(run.tools, run.start.focus)


def _messages(run: _Run) -> list[dict[str, str]]:
    task = run.start.task
    listing = bfcl_data.tool_listing(sorted(run.tools, key=lambda t: t["function"]["name"] not in run.start.focus),
                                     run.tool_docs)
    lines = ["The user's request in this environment:", *(f"  {turn}" for turn in task.turns),
             "Initial state: " + clip(json.dumps(task.initial_state), _STATE_CHARS), ""]
    lines += list(run.start.guidance) + ([""] if run.start.guidance else [])
    if run.calls:
        lines.append("Calls so far, and what each returned:")
        lines += [f"  {c.name}({json.dumps(c.arguments, sort_keys=True)}) -> {clip(c.observation, _OBSERVATION_CHARS)}"
                  for c in run.calls]
    else:
        lines.append("No call has been made yet.")
    lines.append("Write the next call.")
    return [{"role": "system", "content": SYSTEM_PROMPT + listing}, {"role": "user", "content": "\n".join(lines)}]


@dataclass
class Acted:
    """What a batch of runs made: the runs, the model's answers that never fit the call schema, tokens."""

    runs: list[ExplorationRun]
    unusable: int = 0
    tokens: int = 0
    replayed: int = 0


def act(backend, starts: Sequence[Start], calls: int, sampling: SamplingConfig, attempts: int = 2,
        tool_docs: str = "signatures") -> Acted:
    """Run every start for up to `calls` model-written calls (after its replayed prefix), all runs'
    next calls in one batched request per round; the prompt lists the tools as `tool_docs` says."""
    runs = [_open(start, calls, tool_docs) for start in starts]
    before = backend.stats.prompt_tokens + backend.stats.completion_tokens
    unusable = 0
    for _ in range(calls):
        live = [r for r in runs if not r.done]
        if not live:
            break
        schemas = [r.opening if r.opening is not None and len(r.calls) == r.replayed else r.schema for r in live]
        answers = generate_json(backend, [_messages(r) for r in live], schemas, sampling, retries=attempts - 1)
        for run, answer in zip(live, answers):
            if isinstance(answer, StructuredOutputError):
                unusable += 1
                run.done = True
                continue
            _execute(run, str(answer["name"]), dict(answer.get("arguments") or {}))
    tokens = backend.stats.prompt_tokens + backend.stats.completion_tokens - before
    return Acted([ExplorationRun(r.start.task.task_id, r.start.round, tuple(r.calls)) for r in runs],
                 unusable, tokens, sum(r.replayed for r in runs))
