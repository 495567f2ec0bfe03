"""Structured output: a JSON object that satisfies a schema, from any backend.

vLLM constrains decoding to the schema and the OpenAI backend asks the server to; transformers cannot,
so its text is parsed and checked, and the request retried. Every backend's answer is checked the same
way, so a server that ignores `response_format` is caught too.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import jsonschema

from coevolve.services.agent.generation import Backend, Request
from coevolve.services.agent.config import SamplingConfig
from coevolve.services.envs.base import Message


class StructuredOutputError(ValueError):
    """No attempt gave schema-valid JSON; `attempts` holds each text and why it was refused."""

    def __init__(self, attempts: list[tuple[str, str]]):
        self.attempts = attempts
        last_text, last_reason = attempts[-1]
        super().__init__(f"no schema-valid JSON after {len(attempts)} attempt(s); last: {last_reason} "
                         f"in {last_text[:200]!r}")


def check_json(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """The parsed value and None, or None and why the text is not schema-valid JSON."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(body)
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return None, f"schema violation: {exc.message}"
    return value, None


def generate_json(backend: Backend, conversations: Sequence[Sequence[Message]], schema: dict[str, Any],
                  sampling: SamplingConfig, retries: int = 2) -> list[Any | StructuredOutputError]:
    """One schema-valid value per conversation, or the error saying why every attempt failed."""
    jsonschema.Draft202012Validator.check_schema(schema)
    results: list[Any] = [None] * len(conversations)
    attempts: list[list[tuple[str, str]]] = [[] for _ in conversations]
    pending = list(range(len(conversations)))
    for _ in range(retries + 1):
        if not pending:
            break
        completions = backend.generate([Request(messages=conversations[i], json_schema=schema) for i in pending],
                                       sampling)
        still = []
        for i, completion in zip(pending, completions):
            value, reason = (None, completion.error) if completion.error else check_json(completion.text, schema)
            if reason is None:
                results[i] = value
            else:
                attempts[i].append((completion.text, reason))
                still.append(i)
        pending = still
    for i in pending:
        results[i] = StructuredOutputError(attempts[i])
    return results
