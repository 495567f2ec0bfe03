"""One exploration group's work with a model: abstract it into a proposed task, then validate it.

No Kafka here: `check_group` returns the `TaskChecked` record, or the reason the group yields no
proposal (the service dead-letters it). The dual pass's attempts are the validator's own agent:
`attempts` episodes of the built task in one batched `run_episodes`, greedy or sampled, each one's calls
per turn scored against the reference.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import run_episodes
from coevolve.services.agent.structured import StructuredOutputError, generate_json
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.validator.abstraction import (abstraction_messages, build_task, chain_proposal,
                                                     group_schema, synthesized_task_id)
from coevolve.services.validator.config import ValidatorConfig
from coevolve.services.validator.novelty import NoveltyIndex
from coevolve.services.validator.stages import StageOutcome
from coevolve.services.validator.verdict import Attempt, Verdict, attempt_calls, validate, verdict_record


@dataclass(frozen=True)
class Checked:
    """A group's result: a verdict and its event, or (no proposal) the error type and reason."""

    record: dict[str, Any] | None
    verdict: Verdict | None
    error_type: str = ""
    reason: str = ""


def agent_attempt(backend, sampling: SamplingConfig, limits: EpisodeLimits, attempts: int = 1) -> Attempt:
    """The dual pass's attempts: `attempts` episodes of the task by the validator's model, calls per turn."""
    def attempt(task: Task) -> list[list[list[str]]]:
        episodes = run_episodes([task] * attempts, "bfcl", backend, sampling, limits)
        return [attempt_calls(episode.actions, len(task.turns)) for episode in episodes]
    return attempt


def propose(backend, groups: Sequence[tuple[Sequence[Mapping[str, Any]], Task]], config: ValidatorConfig,
            sampling: SamplingConfig) -> list[tuple[dict | None, str, str]]:
    """(proposed task, "", "") for each (group, seed), from one batched generation (none with
    `instructions: calls`: the group's longest chain of calls that worked is the task), or (None, error
    type, reason) when there is nothing to abstract or no answer could be used."""
    nothing = (None, "nothing_to_abstract", "no explored call succeeded, so no reference can be taken from the "
                                            "exploration")
    if config.instructions == "calls":
        chains = [chain_proposal(group, config.max_turns, config.task_calls_per_turn) for group, _ in groups]
        return [(chain, "", "") if chain else nothing for chain in chains]
    schemas = [group_schema(group, seed, config.max_turns, config.reference_from_exploration,
                            config.task_calls_per_turn) for group, seed in groups]
    asked = [i for i, schema in enumerate(schemas) if schema is not None]
    answers = generate_json(backend, [abstraction_messages(*groups[i], schemas[i]) for i in asked],
                            [schemas[i] for i in asked], sampling, retries=config.parse_attempts - 1) if asked else []
    results: list[tuple[dict | None, str, str]] = [nothing] * len(groups)
    for i, answer in zip(asked, answers):
        results[i] = (None, "unparseable_proposal", str(answer)) if isinstance(answer, StructuredOutputError) \
            else (answer, "", "")
    return results


def check_groups(groups: Sequence[Sequence[Mapping[str, Any]]], backend, index: NoveltyIndex,
                 config: ValidatorConfig, sampling: SamplingConfig, limits: EpisodeLimits,
                 attempt_sampling: SamplingConfig | None = None, attempts: int = 1,
                 resolve: Callable[[str], Task] = bfcl_data.get_task) -> list[Checked]:
    """Abstract every group in one batch (with `sampling`), then build and validate each proposed task
    in order, so a task validated first counts as known for the next; the dual pass makes `attempts`
    attempts with `attempt_sampling` (by default greedy with `sampling`'s token limit). `resolve` finds
    the explored task (a BFCL task, or with a `TaskCatalog.get` one the loop validated: its child
    records it as `seed_task_id`, its parent)."""
    attempt_sampling = attempt_sampling or SamplingConfig(temperature=0.0, max_new_tokens=sampling.max_new_tokens)
    results: list[Checked | None] = [None] * len(groups)
    seeded: list[tuple[int, Task]] = []
    for i, group in enumerate(groups):
        try:
            seeded.append((i, resolve(str(group[0]["task_id"]))))
        except KeyError as exc:
            results[i] = Checked(None, None, "no_seed_task", str(exc.args[0]))
    proposals = propose(backend, [(groups[i], seed) for i, seed in seeded], config, sampling)
    for (i, seed), (proposal, error_type, reason) in zip(seeded, proposals):
        if proposal is None:
            results[i] = Checked(None, None, error_type, reason)
            continue
        results[i] = _verdict(groups[i], seed, proposal, index, config,
                              agent_attempt(backend, attempt_sampling, limits, attempts))
    return results  # type: ignore[return-value]


def _verdict(group: Sequence[Mapping[str, Any]], seed: Task, proposal: dict, index: NoveltyIndex,
             config: ValidatorConfig, attempt: Attempt) -> Checked:
    first = group[0]
    ids = [str(e["event_id"]) for e in group]
    task, problem = build_task(proposal, seed, synthesized_task_id(ids))
    if problem:
        verdict = Verdict(task, False, (StageOutcome("well_formed", False, problem),))
    else:
        verdict = validate(task, index, attempt, config)
    signal_ids = sorted({s for e in group for s in (e.get("signal_ids") or [])})
    record = verdict_record(verdict, str(first["run_id"]), int(first["step"]), seed.task_id, signal_ids, ids,
                            int(time.time() * 1000))
    return Checked(record, verdict)


def check_group(group: Sequence[Mapping[str, Any]], backend, index: NoveltyIndex, config: ValidatorConfig,
                sampling: SamplingConfig, limits: EpisodeLimits,
                attempt_sampling: SamplingConfig | None = None, attempts: int = 1) -> Checked:
    """`check_groups` for one group."""
    return check_groups([group], backend, index, config, sampling, limits, attempt_sampling, attempts)[0]
