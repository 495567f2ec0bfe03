"""One plan's work with a model: reflect on each chosen cluster, then explore under its context.

No Kafka here: `explore_plan` returns the events to publish and the clusters to dead-letter, and the
service publishes them. Budgets (runs, tokens, wall time per period) are checked before each cluster,
so a cluster is either explored whole or counted as skipped for the budget.

Where a signal points (`subject_task`): a forgetting or boundary signal names its task, a BFCL task or
one the loop validated (the `TaskCatalog` resolves both); a rare signal names a pattern, so it goes to
the first task of its evidence that resolves, else to the first seed task whose tools include the
pattern's calls. Only an id that resolves nowhere is dead-lettered `no_task`.

The strategies (`ExplorerConfig.strategy`): `signal-guided` reflects on each signal and acts under the
context; `random` is the paper's baseline, the same model and the same constrained calls on random
seed tasks with no signal read; `random-calls` draws random valid calls, no model at all (also the
fallback, recorded as `random-fallback`); `static` explores once at start.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.structured import StructuredOutputError, generate_json
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.catalog import TaskCatalog
from coevolve.services.explorer.acting import Start, act, replay_prefix
from coevolve.services.explorer.config import FALLBACK, ExplorerConfig
from coevolve.services.explorer.planning import Cluster, Plan, pick_random_tasks
from coevolve.services.explorer.random_strategy import ExplorationRun, explore_randomly, is_error_observation
from coevolve.services.explorer.records import exploration_record
from coevolve.services.explorer.reflection import context_schema, parse_context, reflection_messages


STATIC_TRIES = 4
"""The static strategy tries at most this many times `static_tasks` seed tasks for ones with a working call."""


@dataclass(frozen=True)
class Budget:
    """Most work one period may spend; 0 means no limit."""

    runs: int = 0
    tokens: int = 0
    seconds: float = 0.0


@dataclass
class Outcome:
    """What one plan produced: events to publish, clusters to dead-letter, and what it spent."""

    records: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[Cluster, str, str]] = field(default_factory=list)
    """(cluster, error type, reason): reflections that never parsed, or clusters with no task to explore."""
    over_budget: int = 0
    """Signals of chosen clusters left unexplored because a period limit was reached."""
    runs: int = 0
    calls: int = 0
    tokens: int = 0
    unusable: int = 0
    """Model answers that never fit the call schema (each ends its run)."""
    replayed: int = 0
    """Calls replayed from failing rollouts before the model acted."""
    fell_back: bool = False
    """Whether the fallback explored (no signal was)."""


def _spent(outcome: Outcome, budget: Budget, config: ExplorerConfig, started: float) -> bool:
    return bool((budget.runs and outcome.runs + config.runs > budget.runs)
            or (budget.tokens and outcome.tokens >= budget.tokens)
            or (budget.seconds and time.monotonic() - started >= budget.seconds))


def reflect(backend, cluster: Cluster, task: Task, sampling: SamplingConfig, attempts: int) -> tuple[dict | None, str]:
    """The cluster's exploration context, or None and why no answer could be used."""
    answer = generate_json(backend, [reflection_messages(cluster, task)], context_schema(task), sampling,
                           retries=attempts - 1)[0]
    if isinstance(answer, StructuredOutputError):
        return None, str(answer)
    parsed = parse_context(json.dumps(answer), task)  # the schema holds; the task's tools must too
    return (parsed.value, "") if parsed.ok else (None, f"unusable reflection: {parsed.reason}")


def subject_task(cluster: Cluster, catalog: TaskCatalog, seed_ids: Sequence[str]) -> Task:
    """The task a cluster's exploration starts from; KeyError (with where it looked) when none resolves."""
    signal = cluster.primary
    if signal.kind != "rare":
        return catalog.get(signal.task_id or "")
    evidence = signal.record.get("evidence") or {}
    named = list(evidence.get("task_ids") or []) + [t["task_id"] for t in evidence.get("trajectories") or []]
    for task_id in dict.fromkeys(named):
        try:
            return catalog.get(task_id)
        except KeyError:
            continue
    pattern = set(signal.record.get("pattern") or ())
    for task_id in seed_ids:
        task = catalog.get(task_id)
        if pattern <= {t["function"]["name"] for t in bfcl_data.tools_at(task, len(task.turns) - 1)}:
            return task
    raise KeyError(f"rare signal on {' > '.join(sorted(pattern))}: none of its evidence tasks "
                   f"({', '.join(named) or 'none'}) resolves and no seed task has those tools")


def _failing_actions(cluster: Cluster, task_id: str) -> list:
    """The actions of the cluster's lowest-scoring rollout of the task (none for a rare cluster)."""
    rollouts = [t for s in cluster.signals if s.kind != "rare"
                for t in (s.record.get("evidence") or {}).get("trajectories") or [] if t["task_id"] == task_id]
    return list(min(rollouts, key=lambda t: t["score"]).get("actions") or []) if rollouts else []


def failing_prefix(cluster: Cluster, task_id: str) -> tuple:
    """The calls of the cluster's lowest-scoring rollout of the task, up to where it went wrong."""
    return replay_prefix(_failing_actions(cluster, task_id))


def weak_tools(cluster: Cluster, task_id: str) -> tuple[str, ...]:
    """The tools where the weakness shows: a rare pattern's calls, else the call where the cluster's
    lowest-scoring rollout went wrong (its first failing call, or the one after its replayable prefix)."""
    if cluster.primary.kind == "rare":
        return tuple(dict.fromkeys(cluster.primary.record.get("pattern") or ()))
    actions = _failing_actions(cluster, task_id)
    at = len(replay_prefix(actions))
    return (str(actions[at]["name"]),) if at < len(actions) else ()


def guidance(context: dict) -> tuple[str, ...]:
    """The reflection's context as prompt lines."""
    location = context["location"]
    where = f"tools {', '.join(location['tools'])} of {', '.join(location['classes'])}"
    if location.get("state"):
        where += f"; state: {location['state']}"
    return ("An agent fails here. What failed: " + context["failure"], f"Where: {where}.",
            "Explore that: try", *(f"- {item}" for item in context["to_try"]))


def guided_starts(cluster: Cluster, task: Task, context: dict, runs: int, replay: bool) -> list[Start]:
    """R runs under the context, each starting at the weak spot: the first call uses the weak tools (or
    else the context's); with `replay`, round 0 first replays the failing rollout to its failure."""
    lines, focus = guidance(context), tuple(context["location"]["tools"])
    first = weak_tools(cluster, task.task_id) or focus
    prefix = failing_prefix(cluster, task.task_id) if replay else ()
    return [Start(task, r, lines, tuple(dict.fromkeys(first + focus)), prefix if r == 0 else (), first)
            for r in range(runs)]


def _guided(plan: Plan, backend, config: ExplorerConfig, sampling: SamplingConfig, budget: Budget,
            model: str, out: Outcome, json_sampling: SamplingConfig, catalog: TaskCatalog,
            seed_ids: Sequence[str], tool_docs: str) -> None:
    started = time.monotonic()
    for cluster in plan.chosen:
        if _spent(out, budget, config, started):
            out.over_budget += len(cluster.signals)
            continue
        try:
            task = subject_task(cluster, catalog, seed_ids)
        except KeyError as exc:
            out.rejected.append((cluster, "no_task", f"no task to explore: {exc.args[0]}"))
            continue
        before = _tokens(backend)
        context, reason = reflect(backend, cluster, task, json_sampling, config.parse_attempts)
        out.tokens += _tokens(backend) - before
        if context is None:
            out.rejected.append((cluster, "unparseable_reflection", reason))
            continue
        acted = act(backend, guided_starts(cluster, task, context, config.runs, config.replay_failure),
                    config.calls_per_run, sampling, config.parse_attempts, tool_docs)
        _take(out, acted)
        _record(out, acted.runs, plan, cluster, context, "signal-guided", model)


def _unguided(plan: Plan, backend, config: ExplorerConfig, sampling: SamplingConfig, budget: Budget,
              model: str, out: Outcome, catalog: TaskCatalog, seed_ids: Sequence[str], tool_docs: str) -> None:
    """The `random` baseline: the model acts on random seed tasks, with no signal and no context."""
    started = time.monotonic()
    for task_id in pick_random_tasks(seed_ids, config.signals_per_step, plan.run_id, plan.last_step,
                                     config.random_seed):
        if _spent(out, budget, config, started):
            break
        task = catalog.get(task_id)
        acted = act(backend, [Start(task, r) for r in range(config.runs)], config.calls_per_run, sampling,
                    config.parse_attempts, tool_docs)
        _take(out, acted)
        _record(out, acted.runs, plan, None, None, "random", model)


def _tokens(backend) -> int:
    return backend.stats.prompt_tokens + backend.stats.completion_tokens


def _take(out: Outcome, acted) -> None:
    out.tokens += acted.tokens
    out.unusable += acted.unusable
    out.replayed += acted.replayed


def _random_calls(plan: Plan, config: ExplorerConfig, budget: Budget, catalog: TaskCatalog,
                  seed_ids: Sequence[str], out: Outcome, count: int, strategy: str) -> None:
    started = time.monotonic()
    picked = pick_random_tasks(seed_ids, count, plan.run_id, plan.last_step, config.random_seed)
    for task_id in picked:
        if _spent(out, budget, config, started):
            break
        runs = explore_randomly(catalog.get(task_id), config.runs, config.calls_per_run, config.random_seed)
        _record(out, runs, plan, None, None, strategy, "")


def _record(out: Outcome, runs: list[ExplorationRun], plan: Plan, cluster: Cluster | None,
            context: dict | None, strategy: str, model: str) -> None:
    now_ms = int(time.time() * 1000)
    for run in runs:
        out.records.append(exploration_record(run, plan.run_id, plan.last_step, cluster, context, strategy,
                                              model, now_ms))
        out.runs += 1
        out.calls += len(run.calls)


def explore_plan(plan: Plan, backend, config: ExplorerConfig, sampling: SamplingConfig, budget: Budget,
                 model: str, seed_ids: list[str], catalog: TaskCatalog | None = None,
                 limits: EpisodeLimits | None = None, json_sampling: SamplingConfig | None = None) -> Outcome:
    """Explore one closed period by the configured strategy (reflections use `json_sampling`, by
    default `sampling`; prompts list the tools as `limits.tool_docs` says). When that finds no call
    that succeeds (nothing explored, or only failing calls), also explore `fallback_tasks` seed tasks by
    random valid calls (`random-fallback`), so the validator has something to build a task from."""
    out = Outcome()
    catalog = catalog if catalog is not None else TaskCatalog()  # an empty catalog is falsy
    tool_docs = (limits or EpisodeLimits()).tool_docs
    json_sampling = json_sampling or sampling
    # A call is a JSON answer too: a model that fills each string to its bound (tiny-random) needs the JSON
    # budget to close it (with the smoke preset's 48 new tokens no call of its random arm fit the schema).
    sampling = dataclasses.replace(sampling, max_new_tokens=max(sampling.max_new_tokens, json_sampling.max_new_tokens))
    if config.strategy == "static":  # explored once at start (`explore_static`), nothing during training
        return out
    if config.strategy == "random" and plan.gathered:
        _unguided(plan, backend, config, sampling, budget, model, out, catalog, seed_ids, tool_docs)
    elif config.strategy == "random-calls" and plan.gathered:
        _random_calls(plan, config, budget, catalog, seed_ids, out, config.signals_per_step, "random-calls")
    elif config.strategy == "signal-guided":
        _guided(plan, backend, config, sampling, budget, model, out, json_sampling, catalog, seed_ids, tool_docs)
    if config.fallback_tasks and not _found(out.records):
        explored = len(out.records)
        _random_calls(plan, config, budget, catalog, seed_ids, out, config.fallback_tasks, FALLBACK)
        out.fell_back = len(out.records) > explored
    return out


def explore_static(plan: Plan, config: ExplorerConfig, budget: Budget, seed_ids: list[str]) -> Outcome:
    """The static strategy's one exploration: random valid calls on seed tasks, in one seeded order, until
    `static_tasks` of them found a call that works (the validator has nothing to abstract from a task that
    found none, and the learner waits for a verdict on each proposal), trying at most `STATIC_TRIES` times
    as many. Chosen and called alike on every start (the ids repeat, so a restarted explorer publishes
    nothing new)."""
    out = Outcome()
    started, catalog = time.monotonic(), TaskCatalog()
    order = pick_random_tasks(seed_ids, len(seed_ids), plan.run_id, plan.last_step, config.random_seed)
    kept = 0
    for task_id in order[:STATIC_TRIES * config.static_tasks]:
        if kept == config.static_tasks or _spent(out, budget, config, started):
            break
        runs = explore_randomly(catalog.get(task_id), config.runs, config.calls_per_run, config.random_seed)
        if _works(call.observation for run in runs for call in run.calls):
            _record(out, runs, plan, None, None, "static", "")
            kept += 1
    return out


def _found(records: list[dict[str, Any]]) -> bool:
    """Whether any explored call of these records succeeded."""
    return _works(t["observation"] for r in records for t in r["tuples"])


def _works(observations: Iterable[str]) -> bool:
    """Whether any of these calls' observations is not an error."""
    return any(not is_error_observation(observation) for observation in observations)
