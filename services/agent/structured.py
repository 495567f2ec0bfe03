"""Structured output: a JSON object that satisfies a schema, from any model answer or backend.

Models wrap JSON in ```json fences, add prose after it, or think aloud first; `extract_json` finds the
first JSON object in any of those forms without evaluating anything. `parse_structured` checks it with
`jsonschema` (Draft 2020-12) and an optional semantic check, and returns either the value or a reason
precise enough to record on the dead-letter topic. `generate_json` asks a backend in batches: vLLM
constrains decoding to the schema and the OpenAI backend asks the server to; transformers cannot, so
its text is parsed, checked and the request sampled again. Every backend's answer is checked the same
way, so a server that ignores `response_format` is caught too. Nothing here raises on bad model output.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import jsonschema
from jsonschema import Draft202012Validator

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.generation import Backend, Request
from coevolve.services.envs.base import Message

_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"```[A-Za-z]*\s*\n(.*?)```", re.DOTALL)
_MAX_ERRORS = 3


@dataclass(frozen=True)
class Parsed:
    """A checked JSON object, or the reason there is none."""

    value: dict[str, Any] | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.value is not None


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, marked with "..." when cut (prompts stay bounded)."""
    return text if len(text) <= limit else text[:limit] + "..."


def _snippet(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def extract_json(text: str) -> tuple[Any, str]:
    """The first JSON value that starts with `{` in `text`: (value, "") or (None, why not)."""
    text = _THINKING.sub("", text).strip()
    if not text:
        return None, "the answer is empty"
    candidates = [m.group(1).strip() for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        try:
            whole = json.loads(candidate)
        except (ValueError, RecursionError):
            whole = None
        if whole is not None and not isinstance(whole, dict):
            return None, f"expected a JSON object, got a JSON {type(whole).__name__}"
        for start in (i for i, ch in enumerate(candidate) if ch == "{"):
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except (ValueError, RecursionError):
                continue
            if isinstance(value, dict):
                return value, ""
    return None, f"no JSON object found in the answer (it begins: {_snippet(text)!r})"


def _path(error) -> str:
    out = "$"
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def schema_errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """Every way `value` breaks `schema`, as `at $.path: message`, in document order."""
    validator = Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return [f"at {_path(e)}: {e.message}" for e in errors]


def parse_structured(text: str, schema: Mapping[str, Any],
                     check: Callable[[dict[str, Any]], str | None] | None = None) -> Parsed:
    """Parse a model answer against `schema`; `check` adds rules a schema cannot say (returns a reason)."""
    value, reason = extract_json(text)
    if value is None:
        return Parsed(None, reason)
    errors = schema_errors(value, schema)
    if errors:
        more = f" (and {len(errors) - _MAX_ERRORS} more)" if len(errors) > _MAX_ERRORS else ""
        return Parsed(None, "the JSON does not fit the schema: " + "; ".join(errors[:_MAX_ERRORS]) + more)
    problem = check(value) if check else None
    return Parsed(None, problem) if problem else Parsed(value)


class StructuredOutputError(ValueError):
    """No attempt gave schema-valid JSON; `attempts` holds each text and why it was refused."""

    def __init__(self, attempts: list[tuple[str, str]]):
        self.attempts = attempts
        last_text, last_reason = attempts[-1]
        super().__init__(f"no schema-valid JSON after {len(attempts)} attempt(s); last: {last_reason} "
                         f"in {last_text[:200]!r}")


def check_json(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """The parsed object and None, or None and why the text is not schema-valid JSON."""
    parsed = parse_structured(text, schema)
    return (parsed.value, None) if parsed.ok else (None, parsed.reason)


def generate_json(backend: Backend, conversations: Sequence[Sequence[Message]],
                  schema: dict[str, Any] | Sequence[dict[str, Any]], sampling: SamplingConfig,
                  retries: int = 2) -> list[Any | StructuredOutputError]:
    """One schema-valid value per conversation, or the error saying why every attempt failed; `schema`
    is one for all conversations or a list with one per conversation."""
    schemas = [schema] * len(conversations) if isinstance(schema, Mapping) else list(schema)
    if len(schemas) != len(conversations):
        raise ValueError(f"{len(schemas)} schemas for {len(conversations)} conversations")
    for each in schemas:
        jsonschema.Draft202012Validator.check_schema(each)
    results: list[Any] = [None] * len(conversations)
    attempts: list[list[tuple[str, str]]] = [[] for _ in conversations]
    pending = list(range(len(conversations)))
    for _ in range(retries + 1):
        if not pending:
            break
        completions = backend.generate([Request(messages=conversations[i], json_schema=schemas[i])
                                        for i in pending], sampling)
        still = []
        for i, completion in zip(pending, completions):
            value, reason = (None, completion.error) if completion.error else check_json(completion.text, schemas[i])
            if reason is None:
                results[i] = value
            else:
                attempts[i].append((completion.text, reason))
                still.append(i)
        pending = still
    for i in pending:
        results[i] = StructuredOutputError(attempts[i])
    return results
