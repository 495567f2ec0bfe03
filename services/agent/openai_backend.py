"""An OpenAI-compatible chat endpoint (`vllm serve`, or any provider) through the `openai` client.

The key is read from the environment variable the config names (a mounted secret), never from a flag,
and never logged. The client retries failed requests with exponential backoff and enforces the
timeout; a thread pool bounds the requests in flight. Token ids are the server's business: episodes
through this backend carry text, not token sequences, so they cannot be trained on.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, Sequence

from coevolve.services.agent.generation import BackendStats, Completion, Request, request_seed
from coevolve.services.agent.config import BackendConfig, SamplingConfig
from coevolve.services.agent.templates import chat_messages


class OpenAIBackend:
    """Chat completions from an HTTP endpoint."""

    name = "openai"
    tokenizer = None

    def __init__(self, config: BackendConfig):
        from openai import OpenAI

        # A local server needs no key, but the client insists on one; "EMPTY" is vLLM's convention.
        key = os.environ.get(config.api_key_env) or "EMPTY"
        self.client = OpenAI(base_url=config.base_url, api_key=key, timeout=config.request_timeout_s,
                             max_retries=config.max_retries)
        self.model = config.model
        self.version = 0
        self.stats = BackendStats()
        self.pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="openai")
        self._calls = 0

    def generate(self, requests: Sequence[Request], sampling: SamplingConfig) -> list[Completion]:
        """Send the requests concurrently (at most `concurrency` at a time); keep their order."""
        self._calls += 1
        started = time.monotonic()
        futures = [self.pool.submit(self._one, r, sampling, request_seed(sampling, self._calls, i))
                   for i, r in enumerate(requests)]
        results = [f.result() for f in futures]
        self.stats.count(results, time.monotonic() - started)
        return results

    def _one(self, request: Request, sampling: SamplingConfig, seed: int | None) -> Completion:
        kwargs: dict[str, Any] = {"model": self.model, "messages": chat_messages(request.messages, first=True),
                                  "max_tokens": request.max_new_tokens or sampling.max_new_tokens,
                                  "temperature": sampling.temperature, "top_p": sampling.top_p}
        if seed is not None:
            kwargs["seed"] = seed
        if sampling.stop:
            kwargs["stop"] = list(sampling.stop)
        if request.json_schema is not None:
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "output", "schema": request.json_schema,
                                                         "strict": True}}
        try:
            response = self.client.chat.completions.create(**kwargs)
        except Exception as exc:  # the client already retried; the failure is this request's alone
            return Completion.failed(f"{type(exc).__name__}: {exc}", self.version)
        choice = response.choices[0]
        usage = response.usage
        reason = "length" if choice.finish_reason == "length" else "stop"
        return Completion(text=choice.message.content or "", finish_reason=reason, policy_version=self.version,
                          prompt_tokens=usage.prompt_tokens if usage else 0,
                          completion_tokens=usage.completion_tokens if usage else 0)

    def update_weights(self, named_tensors: Any, version: int | None = None) -> NoReturn:
        raise NotImplementedError("an HTTP endpoint's weights are updated by its server, not through this client")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
