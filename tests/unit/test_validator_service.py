"""The validator's per-group work (`proposing.check_group`) with a scripted model on the real BFCL env."""
import json

import pytest

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.envs import bfcl_data
from coevolve.services.explorer.random_strategy import explore_randomly
from coevolve.services.explorer.records import exploration_record
from coevolve.services.explorer.planning import Plan
from coevolve.services.validator.abstraction import synthesized_task_id
from coevolve.services.validator.config import ValidatorConfig
from coevolve.services.validator.novelty import NoveltyIndex
from coevolve.services.validator.proposing import check_group, check_groups
from coevolve.services.validator.config import ValidatorServiceConfig
from coevolve.services.runtime.config import ConfigError
from tests.agent_helpers import ScriptedBackend, byte_tokenizer

SAMPLING = SamplingConfig(temperature=0.0, max_new_tokens=400)
LIMITS = EpisodeLimits(max_context_tokens=100_000)  # the byte tokenizer spends a token per byte
SEED = bfcl_data.get_task("multi_turn_base_0")
CALLS = ["cd(folder='document')", "mkdir(dir_name='drafts')"]
PROPOSAL = {"turns": [  # references from the explored calls; classes and state are the seed's
    {"instruction": "Go into the document folder and make a new folder named drafts there.", "reference": CALLS}]}


def _tuple(name: str, arguments: dict, observation: str) -> dict:
    return {"name": name, "arguments": json.dumps(arguments), "observation": observation, "task_id": SEED.task_id}


def _group():
    """Two random exploration runs; the second also made CALLS, which succeeded."""
    plan = Plan("r1", 2, 2, (), 0, 0, "step")
    runs = explore_randomly(SEED, runs=2, calls=3, seed=0)
    records = [exploration_record(run, plan.run_id, 2, None, None, "random", "", 1) for run in runs]
    records[1]["tuples"] += [_tuple("cd", {"folder": "document"}, '{"current_working_directory": "document"}'),
                             _tuple("mkdir", {"dir_name": "drafts"}, "None")]
    return records


def _backend(proposal: str, attempt: str):
    """Abstractions (JSON-schema requests) get `proposal`; the dual-pass agent answers `attempt`, then stops."""
    def script(request):
        if request.json_schema is not None:
            return proposal
        return attempt if request.messages[-1]["role"] == "user" else "Done."
    return ScriptedBackend(byte_tokenizer(), script)


def _check(backend, index=None, config=ValidatorConfig()):
    index = index if index is not None else NoveltyIndex([SEED])
    return check_group(_group(), backend, index, config, SAMPLING, LIMITS), index


def test_a_proposal_the_agent_solves_is_validated_and_recorded_with_every_stage():
    checked, index = _check(_backend(json.dumps(PROPOSAL), "[" + ", ".join(CALLS) + "]"))
    record = checked.record
    assert record["verdict"] == "validated" and record["validation_score"] == 1.0
    assert [s["stage"] for s in record["stages"]] == ["well_formed", "executable", "novel", "dual_pass"]
    assert record["task_id"] == synthesized_task_id([e["event_id"] for e in _group()])
    assert record["seed_task_id"] == SEED.task_id and record["source"] == "synthesized"
    assert len(index) == 2  # the validated task joins the novelty index


def test_the_same_task_proposed_from_other_explorations_is_a_duplicate():
    backend = _backend(json.dumps(PROPOSAL), "[" + ", ".join(CALLS) + "]")
    first, index = _check(backend)
    other = [{**e, "event_id": f"other-{e['event_id']}"} for e in _group()]
    again = check_group(other, backend, index, ValidatorConfig(), SAMPLING, LIMITS)
    assert again.record["task_id"] != first.record["task_id"]
    assert again.record["verdict"] == "rejected" and again.record["stage"] == "novel"
    assert f"duplicate of {first.record['task_id']}" in again.record["reason"]


def test_a_task_checked_again_is_not_a_duplicate_of_itself():
    """A redelivered group gives the same task id; the index already holds that task (validated before a
    restart) and must not reject it as its own duplicate, nor change its verdict's id."""
    backend = _backend(json.dumps(PROPOSAL), "[" + ", ".join(CALLS) + "]")
    first, index = _check(backend)
    again, _ = _check(backend, index)
    assert again.record["verdict"] == "validated", again.record["reason"]
    assert again.record["event_id"] == first.record["event_id"] and len(index) == 2


def test_an_attempt_that_scores_zero_rejects_the_task_at_the_dual_pass():
    checked, _ = _check(_backend(json.dumps(PROPOSAL), "[ls()]"))
    assert checked.record["verdict"] == "rejected" and checked.record["stage"] == "dual_pass"
    assert checked.record["validation_score"] == 0.0


def test_sampled_attempts_run_in_one_batch_and_one_that_solves_the_task_keeps_it():
    answers = iter(["[ls()]", "[" + ", ".join(CALLS) + "]", "[pwd()]"])

    def script(request):
        if request.json_schema is not None:
            return json.dumps(PROPOSAL)
        return next(answers) if request.messages[-1]["role"] == "user" else "Done."
    backend = ScriptedBackend(byte_tokenizer(), script)
    temperatures, generate = [], backend.generate
    backend.generate = lambda requests, sampling: temperatures.append(sampling.temperature) or generate(requests,
                                                                                                          sampling)
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=400, seed=3)
    checked = check_group(_group(), backend, NoveltyIndex([SEED]), ValidatorConfig(), SAMPLING, LIMITS, sampled, 3)
    assert checked.record["verdict"] == "validated" and checked.record["validation_score"] == 1.0
    assert "best of 3 attempts scored 1.00" in checked.record["reason"] and "scores 0.00, 1.00, 0.00" in \
        checked.record["reason"]
    attempts = [(len(batch), t) for batch, t in zip(backend.batches, temperatures) if batch[0].json_schema is None]
    assert attempts[0] == (3, 1.0)  # the three first turns in one batch, sampled


def test_a_tool_that_does_not_exist_is_rejected_as_malformed_without_an_attempt():
    bad = {"involved_classes": ["GorillaFileSystem"],
           "turns": [{**PROPOSAL["turns"][0], "reference": ["teleport(to='document')"]}]}
    backend = _backend(json.dumps(bad), "[ls()]")
    checked, _ = _check(backend, config=ValidatorConfig(reference_from_exploration=False))
    assert checked.record["stage"] == "well_formed" and "'teleport' is not a tool" in checked.record["reason"]
    assert all(r.json_schema is not None for batch in backend.batches for r in batch)


def test_references_come_from_the_explored_calls_that_succeeded_so_an_invented_call_never_parses():
    invented = {**PROPOSAL, "turns": [{**PROPOSAL["turns"][0], "reference": ["mkdir(dir_name='elsewhere')"]}]}
    backend = _backend(json.dumps(invented), "[ls()]")
    checked, _ = _check(backend, config=ValidatorConfig(parse_attempts=1))
    assert checked.record is None and checked.error_type == "unparseable_proposal"
    assert "at $.turns[0].reference[0]: \"mkdir(dir_name='elsewhere')\" is not one of" in checked.reason
    schema = backend.batches[0][0].json_schema
    assert "initial_state" not in schema["properties"]  # the explored calls succeeded from the seed's state
    assert set(schema["properties"]["turns"]["items"]["properties"]["reference"]["items"]["enum"]) == {
        "ls(a=False)", "ls(a=True)", *CALLS}


def test_a_group_where_no_explored_call_succeeded_is_dead_lettered_without_asking_the_model():
    group = _group()
    for record in group:
        record["tuples"] = [t for t in record["tuples"] if '"error"' in t["observation"]]
    backend = _backend(json.dumps(PROPOSAL), "[ls()]")
    checked = check_group(group, backend, NoveltyIndex([SEED]), ValidatorConfig(), SAMPLING, LIMITS)
    assert checked.record is None and checked.error_type == "nothing_to_abstract" and backend.batches == []


def test_unparseable_abstractions_yield_no_verdict_but_the_reason():
    backend = _backend("Here is a task: make folders.", "[ls()]")
    checked, _ = _check(backend, config=ValidatorConfig(parse_attempts=2))
    assert checked.record is None and checked.error_type == "unparseable_proposal"
    assert "no JSON object found" in checked.reason and len(backend.batches) == 2


def test_without_validation_a_well_formed_task_is_kept_unexecuted():
    backend = _backend(json.dumps(PROPOSAL), "[ls()]")
    checked, _ = _check(backend, config=ValidatorConfig(validation=False))
    assert checked.record["verdict"] == "validated" and [s["stage"] for s in checked.record["stages"]] == ["well_formed"]


def test_ready_groups_are_abstracted_in_one_batch_and_a_repeat_within_it_is_a_duplicate():
    backend = _backend(json.dumps(PROPOSAL), "[" + ", ".join(CALLS) + "]")
    other = [dict(e, event_id=e["event_id"] + "-b") for e in _group()]
    first, second = check_groups([_group(), other], backend, NoveltyIndex([SEED]), ValidatorConfig(), SAMPLING,
                                 LIMITS)
    abstractions = [batch for batch in backend.batches if batch[0].json_schema is not None]
    assert len(abstractions) == 1 and len(abstractions[0]) == 2
    assert first.record["verdict"] == "validated"
    assert second.record["verdict"] == "rejected" and second.record["stage"] == "novel"


def test_several_greedy_attempts_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="set attempt_temperature above 0"):
        ValidatorServiceConfig(attempts=4)
    with pytest.raises(ConfigError, match="attempts=0 must be >= 1"):
        ValidatorServiceConfig(attempts=0)
    assert ValidatorServiceConfig(attempts=4, attempt_temperature=1.0).attempts == 4
