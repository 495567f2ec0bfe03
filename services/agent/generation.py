"""The one generation interface every backend implements.

A `Request` carries chat messages and, for backends that own the tokenizer, the exact prompt ids
(token-in); a `Completion` carries the text, the generated ids, the log-probability of each under the
distribution it was sampled from (logits divided by the sampling temperature, as the learner's
`grpo.token_logprobs` computes them, so a GRPO ratio before any update is 1), why it stopped, and the policy
version of the weights that produced it. A failed request comes back as a completion with `error`
set, never as an exception, so one bad request cannot stop a batch of episodes.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, Sequence

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.envs.base import Message


@dataclass(frozen=True)
class Request:
    """One generation: the conversation so far, and its token ids where the backend tokenizes."""

    messages: Sequence[Message] = ()
    prompt_ids: Sequence[int] | None = None
    json_schema: dict[str, Any] | None = None
    """Constrain the text to this JSON schema (structured output)."""
    max_new_tokens: int | None = None
    """Overrides the sampling config's limit for this request (an episode near its context limit)."""

    def ids(self, template: Any) -> list[int]:
        """The prompt's token ids: `prompt_ids`, else the chat template's rendering of the messages."""
        return list(self.prompt_ids) if self.prompt_ids is not None else template.conversation_ids(self.messages)

    def budget(self, sampling: SamplingConfig, prompt_len: int, max_model_len: int) -> int:
        """New tokens to ask for: the request's or the sampling's limit, within what the context leaves."""
        return max(1, min(self.max_new_tokens or sampling.max_new_tokens, max_model_len - prompt_len))


@dataclass(frozen=True)
class Completion:
    """What one request produced."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    finish_reason: str = "stop"
    """`stop` (end of message), `length` (token limit) or `error`."""
    policy_version: int = 0
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __post_init__(self) -> None:
        if self.token_ids and not self.completion_tokens:
            object.__setattr__(self, "completion_tokens", len(self.token_ids))

    @classmethod
    def failed(cls, error: str, version: int = 0) -> "Completion":
        return cls(text="", finish_reason="error", policy_version=version, error=error)


@dataclass(frozen=True)
class Push:
    """What one `update_weights` did: the version now served, the bytes read from the named tensors, the
    seconds it took, the servers that took it and the live servers left behind (a fleet's; one and none
    for an in-process engine)."""

    version: int
    bytes: int
    seconds: float
    servers: int = 1
    servers_behind: int = 0


class CountedTensors:
    """(name, tensor) pairs passed through once, their bytes summed in `nbytes`."""

    def __init__(self, named_tensors: Iterable[tuple[str, Any]]):
        self.named_tensors = named_tensors
        self.nbytes = 0

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for name, tensor in self.named_tensors:
            self.nbytes += tensor.numel() * tensor.element_size()
            yield name, tensor


@dataclass
class BackendStats:
    """Counters a service exports as metrics."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def count(self, results: Sequence[Completion], seconds: float) -> None:
        """Add one `generate` call's completions and its wall time."""
        self.requests += len(results)
        self.seconds += seconds
        for r in results:
            self.errors += r.error is not None
            self.prompt_tokens += r.prompt_tokens
            self.completion_tokens += r.completion_tokens


class Backend(Protocol):
    """Chat messages (or prompt ids) in, completions out."""

    name: str
    model: str
    version: int
    """Policy version of the current weights; every completion carries it."""
    tokenizer: Any
    """The model's tokenizer where generation is token-in, token-out; None for HTTP backends."""
    stats: BackendStats

    def generate(self, requests: Sequence[Request], sampling: SamplingConfig) -> list[Completion]:
        """One completion per request, in order; failures come back as `Completion.failed`."""

    def update_weights(self, named_tensors: Any, version: int | None = None) -> Push:
        """Load new weights (name, tensor) pairs as the given version (or version + 1); what it did."""

    def close(self) -> None:
        """Release the engine, threads and memory."""


class TakingTurns:
    """The in-process backends' turns: one generate call or one weight update at a time. An update (from
    another thread) waits for a call, and a call for an update, so every completion comes from the one
    version it carries. A subclass sets `self.lock` and implements `_generate` and `_update_weights`."""

    lock: threading.Lock

    def generate(self, requests: Sequence[Request], sampling: SamplingConfig) -> list[Completion]:
        with self.lock:
            return self._generate(requests, sampling)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int | None = None) -> Push:
        with self.lock:
            return self._update_weights(named_tensors, version)


def no_room(prompt_len: int, max_model_len: int, version: int) -> Completion | None:
    """The failed completion of a prompt that fills the context by itself; None when there is room."""
    if prompt_len < max_model_len:
        return None
    return Completion.failed(f"prompt of {prompt_len} tokens leaves no room under max_model_len={max_model_len}",
                             version)


def request_seed(sampling: SamplingConfig, call: int, index: int) -> int | None:
    """A distinct, reproducible seed per request, so K rollouts of one prompt differ."""
    if sampling.seed is None:
        return None
    return (sampling.seed * 1_000_003 + call * 10_007 + index) % (2 ** 31)
