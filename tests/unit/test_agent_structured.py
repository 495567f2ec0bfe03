"""Structured output: schema-checked JSON with retries, from any backend."""
import pytest

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.structured import StructuredOutputError, check_json, generate_json
from tests.agent_helpers import ScriptedBackend, byte_tokenizer

SCHEMA = {"type": "object", "properties": {"where": {"type": "string"}, "tries": {"type": "integer"}},
          "required": ["where", "tries"], "additionalProperties": False}
SAMPLING = SamplingConfig(temperature=0.0, max_new_tokens=200)


def test_valid_json_passes_and_fenced_json_is_unwrapped():
    assert check_json('{"where": "mv", "tries": 2}', SCHEMA) == ({"where": "mv", "tries": 2}, None)
    assert check_json('```json\n{"where": "mv", "tries": 2}\n```', SCHEMA)[0] == {"where": "mv", "tries": 2}


@pytest.mark.parametrize("text, reason", [("where: mv", "no JSON object found"), ('{"where": "mv"}', "'tries' is a required"),
                                          ('{"where": 1, "tries": 2}', "does not fit the schema")])
def test_invalid_output_says_why(text, reason):
    value, why = check_json(text, SCHEMA)
    assert value is None and reason in why


def test_an_invalid_answer_is_retried_until_one_is_valid():
    replies = {"a": iter(["nope", '{"where": "cd", "tries": 1}']), "b": iter(['{"where": "ls", "tries": 3}'])}
    backend = ScriptedBackend(byte_tokenizer(), lambda r: next(replies[r.messages[0]["content"]]))
    out = generate_json(backend, [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
                        SCHEMA, SAMPLING)
    assert out == [{"where": "cd", "tries": 1}, {"where": "ls", "tries": 3}]
    assert [len(b) for b in backend.batches] == [2, 1]
    assert all(r.json_schema == SCHEMA for b in backend.batches for r in b)


def test_every_attempt_failing_gives_an_error_with_each_reason():
    backend = ScriptedBackend(byte_tokenizer(), lambda r: '{"where": "x"}')
    (out,) = generate_json(backend, [[{"role": "user", "content": "a"}]], SCHEMA, SAMPLING, retries=1)
    assert isinstance(out, StructuredOutputError) and len(out.attempts) == 2
    assert "required property" in str(out)


def test_a_backend_error_counts_as_a_failed_attempt():
    backend = ScriptedBackend(byte_tokenizer(), lambda r: RuntimeError("HTTP 503"))
    (out,) = generate_json(backend, [[{"role": "user", "content": "a"}]], SCHEMA, SAMPLING, retries=0)
    assert isinstance(out, StructuredOutputError) and out.attempts == [("", "HTTP 503")]
