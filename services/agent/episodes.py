"""Batched multi-turn episodes: many tasks at once, every round's generations in one backend call.

Each episode is a small state machine: generate, then parse and run the calls in the environment,
then either generate again (tool results, or the next user turn, appended) or stop (every turn done,
or a limit hit). A round collects the next request of every unfinished episode and sends them to the
backend together, so vLLM batches them and serves their shared prompt prefixes from its cache.

Token-in, token-out: an episode's `token_ids` are the template ids of its prompt and observations and
the exact ids the model generated, appended as they happen; `loss_mask` is 1 only on generated ids and
`logprobs` holds each generated id's sampling log-probability (0.0 elsewhere). Nothing is
re-tokenized from decoded text. HTTP backends return text only; their episodes carry no tokens.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from coevolve.services.agent.generation import Backend, Completion, Request
from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.templates import ChatTemplate
from coevolve.services.envs import make_env
from coevolve.services.envs.base import Environment, Message, Task
from coevolve.services.envs.calls import Call, CallLimits, parse_action


@dataclass
class Episode:
    """One finished (or running) episode of one task: its tokens, transcript, actions and outcome."""

    task: Task
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    """Length of the first prompt (system prompt with tools, first user turn) in tokens."""
    messages: list[Message] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    """Each call made: name, arguments (JSON text), observation, turn."""
    calls: list[list[str]] = field(default_factory=list)
    """Per user turn, the calls made, as BFCL call strings."""
    score: float = 0.0
    success: bool = False
    turns: int = 0
    """User turns the agent was given."""
    truncated: str | None = None
    """Why the episode ended before its last turn was done (a limit, a backend error), or None."""
    policy_version: int = 0
    """The oldest policy version among its generations (the backend's version at the start before any)."""
    generations: int = 0
    errors: list[str] = field(default_factory=list)
    """Failed generations (the backend's message each); the request is retried, not shown to the model."""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    done: bool = False

    @property
    def task_id(self) -> str:
        return self.task.task_id

    def generated_segments(self) -> list[list[int]]:
        """The runs of consecutive generated ids (one per generation that produced tokens)."""
        segments, current = [], []
        for token, bit in zip(self.token_ids, self.loss_mask):
            if bit:
                current.append(token)
            elif current:
                segments.append(current)
                current = []
        return segments + ([current] if current else [])

    def to_trajectory_event(self, run_id: str, step: int, rollout_index: int = 0, group_size: int = 1,
                            task_source: str = "seed", event_id: str | None = None,
                            produced_at_ms: int | None = None) -> dict[str, Any]:
        """The episode as a `TrajectoryRecorded` record; the id derives from run, step, task and rollout."""
        if event_id is None:
            event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"coevolve:{run_id}:{step}:{self.task_id}:{rollout_index}"))
        assistant = [m["content"] for m in self.messages if m["role"] == "assistant"]
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return {"event_id": event_id, "run_id": run_id, "step": step, "task_id": self.task_id,
                "task_source": task_source, "rollout_index": rollout_index, "group_size": group_size,
                "score": float(self.score), "success": bool(self.success),
                "actions": [dict(a) for a in self.actions], "turn_count": self.turns,
                "policy_version": self.policy_version, "prompt": "\n".join(users),
                "response": "\n".join(assistant), "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "produced_at": produced_at_ms if produced_at_ms is not None else int(time.time() * 1000)}


PromptRewrite = Callable[[Task, list[Message]], Sequence[Message]]
"""Changes an episode's first messages before they are tokenized (an explorer adds its context)."""


def _arguments(call: Call) -> str:
    values = dict(call.kwargs)
    if call.args:
        values = {"args": list(call.args), **values}
    return json.dumps(values, default=repr, sort_keys=True)


class EpisodesStopped(RuntimeError):
    """`run_episodes` was asked to stop (a service shutting down) before every episode ended."""


class EpisodeRunner:
    """Drives one episode: hands out its next request and takes the completion back."""

    def __init__(self, task: Task, env: Environment, template: ChatTemplate | None, limits: EpisodeLimits,
                 version: int, rewrite_prompt: PromptRewrite | None = None):
        self.env, self.template, self.limits = env, template, limits
        self.episode = ep = Episode(task=task, policy_version=version)
        ep.calls = [[] for _ in task.turns]
        ep.messages = list(env.reset(task))
        if rewrite_prompt is not None:
            ep.messages = list(rewrite_prompt(task, ep.messages))
        self.call_limits = getattr(getattr(env, "config", None), "limits", None) or CallLimits()
        self.turn_calls = 0
        self.errors = 0
        self.presented = 1
        if template is not None:
            ep.token_ids = template.prompt_ids(ep.messages)
            ep.prompt_len = len(ep.token_ids)
            ep.loss_mask = [0] * ep.prompt_len
            ep.logprobs = [0.0] * ep.prompt_len
            if ep.prompt_len >= limits.max_context_tokens:
                self.terminate(f"context limit: the prompt alone has {ep.prompt_len} tokens, the limit "
                               f"is {limits.max_context_tokens}")

    def request(self, sampling: SamplingConfig) -> Request | None:
        """The next generation, or None when the episode has ended."""
        ep = self.episode
        if ep.done:
            return None
        if self.template is None:
            return Request(messages=list(ep.messages))
        room = self.limits.max_context_tokens - len(ep.token_ids)
        if room < 1:
            self.terminate(f"context limit of {self.limits.max_context_tokens} tokens reached")
            return None
        return Request(messages=list(ep.messages), prompt_ids=list(ep.token_ids),
                       max_new_tokens=min(sampling.max_new_tokens, room))

    def consume(self, completion: Completion) -> None:
        """Append the generation, run its calls, and append what comes back (or end the episode)."""
        ep = self.episode
        if completion.error is not None:
            self.errors += 1
            ep.errors.append(completion.error)
            if self.errors >= self.limits.max_backend_errors:
                self.terminate(f"backend error: {completion.error}")
            return
        self.errors = 0
        self._append_generation(completion)
        parsed = parse_action(completion.text, self.call_limits)
        if len(parsed.calls) + self.turn_calls > self.limits.max_calls_per_turn:
            self.terminate(f"more than {self.limits.max_calls_per_turn} calls in turn {self.env.turn}")
            return
        turn = self.env.turn
        result = self.env.step(completion.text)
        self.turn_calls += len(parsed.calls)
        self._record_calls(parsed.calls, result.observations, turn)
        if result.done:
            self._finish(result.score, result.success, result.info.get("terminated"))
            return
        if self.env.turn != turn:
            self.turn_calls = 0
            if self.env.turn >= self.limits.max_user_turns:
                self.terminate(f"user-turn limit of {self.limits.max_user_turns} reached")
                return
        if self.template is not None:
            ids = self.template.continuation_ids(result.observations)
            if len(ep.token_ids) + len(ids) >= self.limits.max_context_tokens:
                self.terminate(f"context limit of {self.limits.max_context_tokens} tokens reached")
                return
            self._append(ids, None)
        ep.messages.extend(result.observations)
        self.presented += self.env.turn != turn

    def _append_generation(self, completion: Completion) -> None:
        ep = self.episode
        # the oldest policy any of its generations came from (backends may update between turns)
        ep.policy_version = completion.policy_version if not ep.generations else \
            min(ep.policy_version, completion.policy_version)
        ep.generations += 1
        ep.messages.append({"role": "assistant", "content": completion.text})
        if self.template is None:
            ep.completion_tokens += completion.completion_tokens
            ep.prompt_tokens = max(ep.prompt_tokens, completion.prompt_tokens)
            return
        if len(completion.logprobs) != len(completion.token_ids):
            raise ValueError(f"backend returned {len(completion.token_ids)} ids but "
                             f"{len(completion.logprobs)} log-probs")
        self._append(list(completion.token_ids), list(completion.logprobs))
        self._append(self.template.close_ids(completion.token_ids), None)

    def _append(self, ids: list[int], logprobs: list[float] | None) -> None:
        ep = self.episode
        ep.token_ids.extend(ids)
        ep.loss_mask.extend([1 if logprobs is not None else 0] * len(ids))
        ep.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        if logprobs is not None:
            ep.completion_tokens += len(ids)
        ep.prompt_tokens = len(ep.token_ids) - ep.completion_tokens

    def _record_calls(self, calls: Sequence[Any], observations: Sequence[Message], turn: int) -> None:
        tool_results = [o for o in observations if o.get("role") == "tool"]
        for call, observation in zip(calls, tool_results):
            valid = isinstance(call, Call)
            self.episode.actions.append({"name": call.name or "invalid",
                                         "arguments": _arguments(call) if valid else json.dumps({"source": call.source}),
                                         "observation": str(observation.get("content", "")), "turn": turn})
            if turn < len(self.episode.calls):
                self.episode.calls[turn].append(call.render() if valid else call.source)

    def terminate(self, reason: str) -> None:
        """End the episode now; the environment fails the current and later turns with `reason`."""
        result = self.env.terminate(reason)
        self._finish(result.score, result.success, reason)

    def _finish(self, score: float, success: bool, reason: str | None) -> None:
        ep = self.episode
        ep.done = True
        ep.score, ep.success, ep.truncated = float(score), bool(success), reason
        ep.turns = self.presented


def run_episodes(tasks: Sequence[Task], env: str | Callable[[], Environment], backend: Backend,
                 sampling: SamplingConfig, limits: EpisodeLimits | None = None,
                 on_done: Callable[[Episode], None] | None = None,
                 max_in_flight: int | None = None, rewrite_prompt: PromptRewrite | None = None,
                 should_stop: Callable[[], bool] | None = None) -> list[Episode]:
    """Play one episode per task (repeat a task for K rollouts), batching each round's generations.

    At most `max_in_flight` episodes run at once (all by default); a finished one makes room for the
    next task. `rewrite_prompt` may change each episode's first messages. Episodes come back in the
    order of `tasks`. When `should_stop()` turns true, the next round raises `EpisodesStopped`.
    """
    limits = limits or EpisodeLimits()
    make = (lambda: make_env(env, tool_docs=limits.tool_docs)) if isinstance(env, str) else env
    template = getattr(backend, "template", None) if backend.tokenizer is not None else None
    width = max_in_flight or max(len(tasks), 1)
    queue = list(enumerate(tasks))[::-1]
    active: list[tuple[int, EpisodeRunner]] = []
    episodes: list[Episode | None] = [None] * len(tasks)
    while queue or active:
        if should_stop is not None and should_stop():
            raise EpisodesStopped(f"stopped with {len(active)} episodes running and {len(queue)} not started")
        while queue and len(active) < width:
            index, task = queue.pop()
            active.append((index, EpisodeRunner(task, make(), template, limits, backend.version, rewrite_prompt)))
        pending = [(runner, req) for _, runner in active if (req := runner.request(sampling)) is not None]
        if pending:
            completions = backend.generate([req for _, req in pending], sampling)
            if len(completions) != len(pending):
                raise RuntimeError(f"backend {backend.name} returned {len(completions)} completions "
                                   f"for {len(pending)} requests")
            for (runner, _), completion in zip(pending, completions):
                runner.consume(completion)
        still = []
        for index, runner in active:
            if runner.episode.done:
                episodes[index] = runner.episode
                if on_done is not None:
                    on_done(runner.episode)
            else:
                still.append((index, runner))
        active = still
    return [e for e in episodes if e is not None]
