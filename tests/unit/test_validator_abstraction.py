"""Abstraction: the prompt shows what exploration found; recorded answers parse into runnable tasks or say why not."""
import json
from pathlib import Path

import pytest

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.bfcl import reference_problems, score_calls
from coevolve.services.validator.abstraction import (abstraction_messages, build_task, chain_proposal,
                                                     explored_chains, group_schema, merge_patch, parse_proposal,
                                                     split_turns, successful_calls, synthesized_task_id,
                                                     task_schema)
from coevolve.services.validator.stages import check_well_formed
from coevolve.services.validator.groups import ExplorationGroups

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "abstraction"
SEED = bfcl_data.get_task("multi_turn_base_0")


def _fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


def exploration(event_id="e0", round_=0, signal_id="sig", tuples=None, step=3):
    tuples = tuples if tuples is not None else [
        {"name": "cd", "arguments": '{"folder": "document"}', "observation": '{"current_working_directory": "document"}'},
        {"name": "mv", "arguments": '{"source": "x", "destination": "y"}', "observation": '{"error": "mv: no x"}'},
        {"name": "cd", "arguments": '{"folder": "document"}', "observation": '{"current_working_directory": "document"}'},
    ]
    return {"event_id": event_id, "run_id": "r1", "step": step, "signal_id": signal_id, "task_id": SEED.task_id,
            "round": round_, "context": '{"failure": "mv before mkdir"}', "tuples": [dict(t, task_id=SEED.task_id)
                                                                                  for t in tuples]}


def test_the_prompt_shows_the_seed_the_contexts_and_only_the_calls_that_succeeded():
    system, user = abstraction_messages([exploration(), exploration("e1", 1)], SEED)
    assert json.dumps(task_schema()) in system["content"]
    text = user["content"]
    assert SEED.turns[0] in text and text.count('{"failure": "mv before mkdir"}') == 1
    assert "cd(folder='document') -> " in text and "mv(" not in text
    assert successful_calls([exploration()]) == [("cd(folder='document')", '{"current_working_directory": "document"}')]


@pytest.mark.parametrize("name", ["valid", "fenced_with_state", "trailing_prose"])
def test_recorded_answers_that_hold_a_task_parse_into_tasks_whose_reference_passes(name):
    parsed = parse_proposal(_fixture(name))
    assert parsed.ok, parsed.reason
    task, problem = build_task(parsed.value, SEED, "synthesized_x")
    assert problem == "" and len(task.turns) == len(task.reference)
    assert set(task.initial_state) == {"GorillaFileSystem"} and task.involved_classes == ("GorillaFileSystem",)
    result = score_calls(task, [list(t) for t in task.reference])
    assert result["success"], result


@pytest.mark.parametrize("name,reason", [
    ("wrong_types", "the JSON does not fit the schema: at $.turns[0].reference[0]: {'name': 'mkdir'} is not of "
                    "type 'string'; at $.turns[1]: 'List the files' is not of type 'object'"),
    ("missing_fields", "the JSON does not fit the schema: at $.turns[0]: 'reference' is a required property"),
    ("not_json", 'no JSON object found in the answer (it begins: "Task: make a folder named drafts.'),
    ("unknown_class", "the JSON does not fit the schema: at $.involved_classes[0]: 'EmailAPI' is not one of"),
])
def test_recorded_malformed_answers_are_refused_with_a_precise_reason(name, reason):
    parsed = parse_proposal(_fixture(name))
    assert parsed.value is None
    assert parsed.reason.startswith(reason)


def test_too_many_turns_are_refused():
    answer = json.dumps({"involved_classes": ["GorillaFileSystem"],
                         "turns": [{"instruction": "ls", "reference": ["ls()"]}] * 3})
    assert parse_proposal(answer, task_schema(max_turns=3)).ok
    assert "is too long" in parse_proposal(answer, task_schema(max_turns=2)).reason


def test_a_groups_schema_offers_its_explored_calls_that_succeeded_and_the_seeds_classes():
    schema = group_schema([exploration(), exploration("e1", 1)], SEED)
    assert schema["properties"]["turns"]["items"]["properties"]["reference"]["items"] == {
        "enum": ["cd(folder='document')"]}
    assert set(schema["properties"]) == {"turns"}  # the seed's classes and state: where the calls succeeded
    task, problem = build_task({"turns": [{"instruction": "Go to document", "reference": ["cd(folder='document')"]}]},
                               SEED, "synthesized_x")
    assert problem == "" and task.involved_classes == SEED.involved_classes
    assert task.initial_state == {c: SEED.initial_state[c] for c in SEED.involved_classes}
    assert group_schema([exploration(tuples=[])], SEED) is None
    assert group_schema([exploration(tuples=[])], SEED, from_exploration=False) == task_schema()
    system, _ = abstraction_messages([exploration()], SEED, schema)
    assert json.dumps(schema) in system["content"]


def test_the_initial_state_is_the_seeds_patched_and_the_seed_is_untouched():
    before = json.dumps(SEED.initial_state, sort_keys=True)
    task, _ = build_task(parse_proposal(_fixture("fenced_with_state")).value, SEED, "synthesized_x")
    archive = task.initial_state["GorillaFileSystem"]["root"]["workspace"]["contents"]["archive"]
    assert archive["contents"] == {"old.txt": {"type": "file", "content": "old notes"}}
    assert archive["type"] == "directory"  # kept from the seed
    assert json.dumps(SEED.initial_state, sort_keys=True) == before
    assert merge_patch({"a": 1, "b": {"c": 2}}, {"b": {"c": None, "d": 3}}) == {"a": 1, "b": {"d": 3}}


def test_a_group_of_explorations_always_gives_the_same_task_id():
    assert synthesized_task_id(["b", "a"]) == synthesized_task_id(["a", "b"]) != synthesized_task_id(["a"])
    assert "long_context" not in synthesized_task_id(["a"])  # Task.from_record reads that from the id


def test_groups_complete_when_every_round_arrived_and_ignore_redeliveries():
    groups = ExplorationGroups(rounds=2)
    assert groups.add(exploration("e0", 0), now=0.0) is None
    assert groups.add(exploration("e0", 0), now=1.0) is None
    assert groups.add(exploration("x0", 0, signal_id="other"), now=1.0) is None
    complete = groups.add(exploration("e1", 1), now=2.0)
    assert [e["event_id"] for e in complete] == ["e0", "e1"]
    assert groups.expire(now=5.0, max_wait_s=10.0) == []
    assert [[e["event_id"] for e in g] for g in groups.expire(now=11.0, max_wait_s=10.0)] == [["x0"]]
    assert groups.add(exploration("e1", 1), now=12.0) is None


def test_a_state_patch_that_is_not_a_json_object_is_named_as_the_problem_and_the_seed_state_kept():
    task, problem = build_task(parse_proposal(_fixture("patch_not_an_object")).value, SEED, "synthesized_x")
    assert problem == "initial_state must be a JSON object (a merge patch), not a JSON list"
    assert task.initial_state == {"GorillaFileSystem": SEED.initial_state["GorillaFileSystem"]}
    _, garbage = build_task({"involved_classes": ["GorillaFileSystem"], "initial_state": "{oops",
                             "turns": [{"instruction": "ls", "reference": ["ls()"]}]}, SEED, "synthesized_y")
    assert garbage.startswith("initial_state is not JSON text: ")


def _bounded(schema, path="$"):
    """Every string and array of a schema without a length bound, by path."""
    loose = []
    if schema.get("type") == "string" and "maxLength" not in schema:
        loose.append(path)
    if schema.get("type") == "array":
        if "maxItems" not in schema:
            loose.append(path)
        loose += _bounded(schema["items"], path + "[]")
    if schema.get("type") == "object":
        assert schema.get("additionalProperties") is False, path  # a free object has no bound
        for name, sub in schema["properties"].items():
            loose += _bounded(sub, f"{path}.{name}")
    return loose


def test_both_answer_schemas_bound_every_string_and_array():
    from coevolve.services.explorer.reflection import CONTEXT_SCHEMA

    assert _bounded(task_schema()) == [] and _bounded(CONTEXT_SCHEMA) == []
    assert _bounded(group_schema([exploration()], SEED)) == []
    assert _bounded({"type": "object", "additionalProperties": False, "properties": {
        "a": {"type": "string"}, "b": {"type": "array", "items": {"type": "string", "maxLength": 3}}}}) == ["$.a", "$.b"]


def _call(name, arguments, observation):
    return {"name": name, "arguments": json.dumps(arguments), "observation": observation}


CHAIN = [_call("cd", {"folder": "document"}, '{"current_working_directory": "document"}'),
         _call("mv", {"source": "x", "destination": "y"}, '{"error": "mv: no x"}'),
         _call("mkdir", {"dir_name": "temp"}, "None"),
         _call("mkdir", {"dir_name": "temp"}, "None"),
         _call("mv", {"source": "final_report.pdf", "destination": "temp"}, '{"result": "moved"}')]


def test_a_runs_calls_that_worked_form_a_chain_in_the_order_they_ran():
    short = exploration("e1", 1, tuples=CHAIN[:1])
    assert explored_chains([exploration("e0", 0, tuples=CHAIN), short]) == [
        ["cd(folder='document')", "mkdir(dir_name='temp')", "mv(source='final_report.pdf', destination='temp')"],
        ["cd(folder='document')"]]
    assert explored_chains([exploration(tuples=CHAIN[1:2])]) == []
    assert split_turns(list("abcde"), 2) == [["a", "b", "c"], ["d", "e"]] and split_turns(["a"], 3) == [["a"]]


def test_the_longest_chain_becomes_a_task_in_words_whose_reference_replays_in_the_environment():
    group = [exploration("e0", 0, tuples=CHAIN[:1]), exploration("e1", 1, tuples=CHAIN)]
    proposal = chain_proposal(group, max_turns=2, calls_per_turn=2)
    assert proposal == {"turns": [{"reference": ["cd(folder='document')", "mkdir(dir_name='temp')"]},
                                  {"reference": ["mv(source='final_report.pdf', destination='temp')"]}]}
    task, problem = build_task(proposal, SEED, "synthesized_chain")
    assert problem == "" and len(task.turns) == 2
    assert task.turns[0] == ('Change the current working directory to the specified folder (the folder of the '
                             'directory to change to: "document"), then create a new directory in the current '
                             'directory (the name of the new directory at current directory: "temp").')
    assert "(" not in task.turns[1].split(" (")[0] and '"final_report.pdf"' in task.turns[1]
    assert reference_problems(task) == []
    assert score_calls(task, [list(turn) for turn in task.reference])["success"]
    assert check_well_formed(task).passed


def test_a_chain_is_cut_to_the_configured_bound_and_no_chain_means_nothing_to_abstract():
    assert chain_proposal([exploration(tuples=CHAIN)], max_turns=1, calls_per_turn=2) == {
        "turns": [{"reference": ["cd(folder='document')", "mkdir(dir_name='temp')"]}]}
    assert chain_proposal([exploration(tuples=CHAIN[1:2])], max_turns=3, calls_per_turn=3) is None
