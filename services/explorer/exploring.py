"""One plan's work with a model: reflect on each chosen cluster, then explore under its context.

No Kafka here: `explore_plan` returns the events to publish and the clusters to dead-letter, and the
service publishes them. Budgets (runs, tokens, wall time per period) are checked before each cluster,
so a cluster is either explored whole or counted as skipped for the budget.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import run_episodes
from coevolve.services.agent.structured import StructuredOutputError, generate_json
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.explorer.config import FALLBACK, ExplorerConfig
from coevolve.services.explorer.planning import Cluster, Plan, pick_random_tasks
from coevolve.services.explorer.random_strategy import ExplorationRun, explore_randomly, is_error_observation
from coevolve.services.explorer.records import exploration_record
from coevolve.services.explorer.reflection import (context_schema, exploration_task, parse_context,
                                                   reflection_messages)


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


def explore_guided(backend, task: Task, context: dict, config: ExplorerConfig, sampling: SamplingConfig,
                   limits: EpisodeLimits) -> tuple[list[ExplorationRun], int]:
    """R runs of the agent under the context, each up to S calls; the runs and the tokens spent."""
    limits = dataclasses.replace(limits, max_user_turns=1, max_calls_per_turn=config.calls_per_run)
    episodes = run_episodes([exploration_task(task, context)] * config.runs, "bfcl", backend, sampling, limits)
    runs = [ExplorationRun.from_actions(task.task_id, r, e.actions[:config.calls_per_run])
            for r, e in enumerate(episodes)]
    return runs, sum(e.prompt_tokens + e.completion_tokens for e in episodes)


def _guided(plan: Plan, backend, config: ExplorerConfig, sampling: SamplingConfig, budget: Budget,
            limits: EpisodeLimits, model: str, out: Outcome, json_sampling: SamplingConfig) -> None:
    started = time.monotonic()
    for cluster in plan.chosen:
        if _spent(out, budget, config, started):
            out.over_budget += len(cluster.signals)
            continue
        try:
            task = bfcl_data.get_task(cluster.task_id or "")
        except KeyError as exc:
            out.rejected.append((cluster, "no_task", f"no task to explore: {exc.args[0]}"))
            continue
        context, reason = reflect(backend, cluster, task, json_sampling, config.parse_attempts)
        if context is None:
            out.rejected.append((cluster, "unparseable_reflection", reason))
            continue
        runs, tokens = explore_guided(backend, task, context, config, sampling, limits)
        out.tokens += tokens
        _record(out, runs, plan, cluster, context, "signal-guided", model)


def _random(plan: Plan, config: ExplorerConfig, budget: Budget, task_ids: list[str], out: Outcome,
            count: int, strategy: str) -> None:
    started = time.monotonic()
    picked = pick_random_tasks(task_ids, count, plan.run_id, plan.last_step, config.random_seed)
    for task_id in picked:
        if _spent(out, budget, config, started):
            break
        runs = explore_randomly(bfcl_data.get_task(task_id), config.runs, config.calls_per_run, config.random_seed)
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
                 model: str, task_ids: list[str], limits: EpisodeLimits | None = None,
                 json_sampling: SamplingConfig | None = None) -> Outcome:
    """Explore one closed period by the configured strategy (`limits` bound each run's context, and
    reflections use `json_sampling`, by default `sampling`); when that finds no call that succeeds
    (nothing explored, or only failing calls), also `fallback_tasks` seed tasks by the random strategy
    (`random-fallback`), so the validator has something to build a task from."""
    out = Outcome()
    if config.strategy == "static":  # explored once at start (`explore_static`), nothing during training
        return out
    if config.strategy == "random" and plan.gathered:
        _random(plan, config, budget, task_ids, out, config.signals_per_step, "random")
    elif config.strategy != "random":
        _guided(plan, backend, config, sampling, budget, limits or EpisodeLimits(), model, out,
                json_sampling or sampling)
    if config.fallback_tasks and not _found(out.records):
        explored = len(out.records)
        _random(plan, config, budget, task_ids, out, config.fallback_tasks, FALLBACK)
        out.fell_back = len(out.records) > explored
    return out


def explore_static(plan: Plan, config: ExplorerConfig, budget: Budget, task_ids: list[str]) -> Outcome:
    """The static strategy's one exploration: `static_tasks` seed tasks by random valid calls, chosen and
    called alike on every start (the ids repeat, so a restarted explorer publishes nothing new)."""
    out = Outcome()
    _random(plan, config, budget, task_ids, out, config.static_tasks, "static")
    return out


def _found(records: list[dict[str, Any]]) -> bool:
    """Whether any explored call succeeded."""
    return any(not is_error_observation(t["observation"]) for r in records for t in r["tuples"])
