"""Structured model output: a JSON object is found in common wrappings, checked, and retried with the reason."""
import pytest

from coevolve.services.agent.structured import extract_json, parse_structured

SCHEMA = {"type": "object", "required": ["a"], "additionalProperties": False,
          "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}}}


@pytest.mark.parametrize("text", [
    '{"a": 1}',
    '```json\n{"a": 1}\n```',
    '```\n{"a": 1}\n```\nDone.',
    'Sure, here it is: {"a": 1} -- and {"a": 2} is another.',
    '<think>maybe {"a": 3}</think>{"a": 1}',
])
def test_the_first_object_is_found_in_plain_fenced_prefixed_and_thinking_answers(text):
    assert extract_json(text) == ({"a": 1}, "")


@pytest.mark.parametrize("text,reason", [
    ("", "the answer is empty"),
    ("no json here", "no JSON object found in the answer (it begins: 'no json here')"),
    ("[1, 2]", "expected a JSON object, got a JSON list"),
    ('{"a": 1', "no JSON object found"),
])
def test_answers_without_an_object_say_why(text, reason):
    value, why = extract_json(text)
    assert value is None and why.startswith(reason)


def test_schema_errors_name_the_json_path_in_document_order():
    parsed = parse_structured('{"a": "x", "b": ["ok", 3], "c": 1}', SCHEMA)
    assert not parsed.ok
    assert parsed.reason == ("the JSON does not fit the schema: at $: Additional properties are not allowed "
                             "('c' was unexpected); at $.a: 'x' is not of type 'integer'; "
                             "at $.b[1]: 3 is not of type 'string'")


def test_a_semantic_check_runs_after_the_schema():
    parsed = parse_structured('{"a": 5}', SCHEMA, lambda v: "a must be even" if v["a"] % 2 else None)
    assert (parsed.ok, parsed.reason) == (False, "a must be even")
    assert parse_structured('{"a": 4}', SCHEMA, lambda v: None).value == {"a": 4}
