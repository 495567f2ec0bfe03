"""Reflection: the prompt carries the signal's evidence; recorded model answers parse or say why not."""
import json
from pathlib import Path

import pytest

from coevolve.services.envs import bfcl_data
from coevolve.services.explorer.planning import Cluster, SignalRef
from coevolve.services.explorer.reflection import CONTEXT_SCHEMA, context_schema, parse_context, reflection_messages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reflection"
TASK = bfcl_data.get_task("multi_turn_base_0")


def _fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


def boundary_signal(event_id="s1", step=4, task_id="multi_turn_base_0") -> dict:
    actions = [{"name": "mv", "arguments": '{"source": "final_report.pdf", "destination": "temp"}',
                "observation": '{"error": "mv: no such directory: temp"}'}]
    return {"event_id": event_id, "kind": "boundary", "run_id": "r1", "step": step, "subject": task_id,
            "task_id": task_id, "pattern": [], "incomplete": False, "produced_at": 1000 + step,
            "thresholds": {"success_threshold": 0.5, "window": 5, "rare_threshold": 5.0, "pattern_length": 1},
            "evidence": {"scores": [0.75, 0.0], "attempt_score": 0.375, "previous_scores": [], "pattern_count": 0,
                         "pattern_total": 0, "task_ids": [task_id],
                         "trajectories": [{"event_id": "t1", "task_id": task_id, "rollout_index": 1, "score": 0.0,
                                           "actions": actions}]}}


def test_the_prompt_carries_the_schema_the_task_and_the_evidence():
    cluster = Cluster((SignalRef.from_record(boundary_signal()),))
    system, user = reflection_messages(cluster, TASK)
    assert json.dumps(context_schema(TASK)) in system["content"]
    tools = context_schema(TASK)["properties"]["location"]["properties"]["tools"]
    assert "mkdir" in tools["items"]["enum"] and tools["maxItems"] == CONTEXT_SCHEMA["properties"]["location"][
        "properties"]["tools"]["maxItems"]
    text = user["content"]
    assert "Signal boundary" in text and "Rollout scores: 0.75, 0.00." in text
    assert TASK.turns[0] in text and "GorillaFileSystem" in text and "mkdir" in text
    assert 'mv({"source": "final_report.pdf", "destination": "temp"}) -> {"error": "mv: no such directory: temp"}' in text


@pytest.mark.parametrize("name,tools", [("valid", ["mkdir", "mv", "cd"]), ("fenced", ["cd", "mkdir"]),
                                        ("trailing_prose", ["authenticate_twitter", "post_tweet"])])
def test_recorded_answers_that_hold_a_valid_context_parse(name, tools):
    parsed = parse_context(_fixture(name), TASK)
    assert parsed.ok, parsed.reason
    assert parsed.value["location"]["tools"] == tools and parsed.value["to_try"]


@pytest.mark.parametrize("name,reason", [
    ("wrong_types", "the JSON does not fit the schema: at $.location.classes: 'GorillaFileSystem' is not of "
                    "type 'array'; at $.to_try: 'move the file' is not of type 'array'"),
    ("missing_fields", "the JSON does not fit the schema: at $: 'to_try' is a required property; "
                       "at $.location: 'tools' is a required property"),
    ("not_json", "no JSON object found in the answer (it begins: 'The agent should first create the"),
    ("unknown_tool", "the JSON does not fit the schema: at $.location.tools[0]: 'rename_file' is not one of"),
    ("array", "expected a JSON object, got a JSON list"),
])
def test_recorded_malformed_answers_are_refused_with_a_precise_reason(name, reason):
    parsed = parse_context(_fixture(name), TASK)
    assert parsed.value is None
    assert parsed.reason.startswith(reason)


def test_a_class_the_task_does_not_involve_is_refused():
    answer = _fixture("valid").replace('"classes": ["GorillaFileSystem"]', '"classes": ["TravelAPI"]')
    assert parse_context(answer, TASK).reason.startswith("the JSON does not fit the schema: at "
                                                         "$.location.classes[0]: 'TravelAPI' is not one of")
