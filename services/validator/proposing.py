"""One exploration group's work with a model: abstract it into a proposed task, then validate it.

No Kafka here: `check_group` returns the `TaskChecked` record, or the reason the group yields no
proposal (the service dead-letters it). The dual pass's attempt is the validator's own agent: one
greedy episode of the built task with `run_episodes`, its calls per turn scored against the reference.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import run_episodes
from coevolve.services.agent.structured import StructuredOutputError, generate_json
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.validator.abstraction import (abstraction_messages, build_task, synthesized_task_id,
                                                     task_schema)
from coevolve.services.validator.config import ValidatorConfig
from coevolve.services.validator.novelty import NoveltyIndex
from coevolve.services.validator.stages import StageOutcome
from coevolve.services.validator.verdict import Verdict, attempt_calls, validate, verdict_record


@dataclass(frozen=True)
class Checked:
    """A group's result: a verdict and its event, or (no proposal) the error type and reason."""

    record: dict[str, Any] | None
    verdict: Verdict | None
    error_type: str = ""
    reason: str = ""


def agent_attempt(backend, sampling: SamplingConfig, limits: EpisodeLimits):
    """The dual pass's attempt: one episode of the task by the validator's model, calls per turn."""
    def attempt(task: Task) -> list[list[str]]:
        episode = run_episodes([task], "bfcl", backend, sampling, limits)[0]
        return attempt_calls(episode.actions, len(task.turns))
    return attempt


def propose(backend, group: Sequence[Mapping[str, Any]], seed: Task, config: ValidatorConfig,
            sampling: SamplingConfig) -> tuple[dict | None, str]:
    """The proposed task for a group, or None and why no answer could be used."""
    messages = abstraction_messages(group, seed, config.max_turns)
    answer = generate_json(backend, [messages], task_schema(config.max_turns), sampling,
                           retries=config.parse_attempts - 1)[0]
    if isinstance(answer, StructuredOutputError):
        return None, str(answer)
    return answer, ""


def check_group(group: Sequence[Mapping[str, Any]], backend, index: NoveltyIndex, config: ValidatorConfig,
                sampling: SamplingConfig, limits: EpisodeLimits,
                attempt_sampling: SamplingConfig | None = None) -> Checked:
    """Abstract (with `sampling`), build and validate one group's proposed task; the dual pass's
    attempt is greedy (`attempt_sampling`, by default greedy with `sampling`'s token limit)."""
    attempt_sampling = attempt_sampling or SamplingConfig(temperature=0.0, max_new_tokens=sampling.max_new_tokens)
    first = group[0]
    try:
        seed = bfcl_data.get_task(str(first["task_id"]))
    except KeyError as exc:
        return Checked(None, None, "no_seed_task", str(exc.args[0]))
    proposal, reason = propose(backend, group, seed, config, sampling)
    if proposal is None:
        return Checked(None, None, "unparseable_proposal", reason)
    ids = [str(e["event_id"]) for e in group]
    task, problem = build_task(proposal, seed, synthesized_task_id(ids))
    if problem:
        verdict = Verdict(task, False, (StageOutcome("well_formed", False, problem),))
    else:
        verdict = validate(task, index, agent_attempt(backend, attempt_sampling, limits), config)
    signal_ids = sorted({s for e in group for s in (e.get("signal_ids") or [])})
    record = verdict_record(verdict, str(first["run_id"]), int(first["step"]), seed.task_id, signal_ids, ids,
                            int(time.time() * 1000))
    return Checked(record, verdict)
