"""tiny-random under vLLM's grammar-constrained decoding: reflections and abstractions end in complete,
schema-valid answers (the schemas bound every string and array), so a random-weight validator turns a
real exploration into a well-formed proposal (its references are explored calls) that reaches a verdict
instead of a dead letter."""
import pytest

from coevolve.schemas.codec import default_registry
from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.structured import StructuredOutputError, generate_json
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import score_calls
from coevolve.services.explorer.planning import Cluster, SignalRef
from coevolve.services.explorer.random_strategy import explore_randomly
from coevolve.services.explorer.records import exploration_record
from coevolve.services.explorer.reflection import CONTEXT_SCHEMA, context_schema, reflection_messages
from coevolve.services.validator.abstraction import abstraction_messages, group_schema, task_schema
from coevolve.services.validator.config import ValidatorConfig
from coevolve.services.validator.novelty import NoveltyIndex
from coevolve.services.validator.proposing import check_group
from coevolve.services.validator.wording import leaked_call
from tests.agent_engines import TINY_RANDOM, vllm_backend
from tests.unit.test_explorer_reflection import boundary_signal

pytestmark = [pytest.mark.slow, pytest.mark.integration]
JSON = SamplingConfig(temperature=1.0, max_new_tokens=1024)
SEED = bfcl_data.get_task("multi_turn_base_0")


@pytest.fixture(scope="module")
def tiny():
    return vllm_backend(TINY_RANDOM)


def test_vllms_grammar_backend_accepts_both_answer_schemas():
    from vllm.v1.structured_output.backend_xgrammar import has_xgrammar_unsupported_json_features

    assert not has_xgrammar_unsupported_json_features(CONTEXT_SCHEMA)
    assert not has_xgrammar_unsupported_json_features(context_schema(SEED))
    assert not has_xgrammar_unsupported_json_features(task_schema())
    group = [exploration_record(run, "r1", 4, None, None, "random", "", 0)
             for run in explore_randomly(SEED, runs=2, calls=3, seed=0)]
    assert not has_xgrammar_unsupported_json_features(group_schema(group, SEED))


def test_random_weights_under_the_grammar_end_reflections_and_abstractions_in_schema_valid_json(tiny):
    cluster = Cluster((SignalRef.from_record(boundary_signal()),))
    runs = explore_randomly(SEED, runs=2, calls=3, seed=0)
    group = [exploration_record(run, "r1", 4, None, None, "random", "", 0) for run in runs]
    attempts = ValidatorConfig().parse_attempts  # the services' default, as in the explorer's config
    reflections = generate_json(tiny, [reflection_messages(cluster, SEED)] * 2, context_schema(SEED), JSON,
                                retries=attempts - 1)
    proposals = generate_json(tiny, [abstraction_messages(group, SEED)] * 2, task_schema(), JSON,
                              retries=attempts - 1)
    proposals += generate_json(tiny, [abstraction_messages(group, SEED, group_schema(group, SEED))] * 2,
                               group_schema(group, SEED), JSON, retries=attempts - 1)
    failed = [str(a) for a in reflections + proposals if isinstance(a, StructuredOutputError)]
    assert failed == []


def test_a_tiny_random_validator_turns_a_real_exploration_into_a_proposal_with_a_verdict(tiny):
    runs = explore_randomly(SEED, runs=2, calls=3, seed=1)
    group = [exploration_record(run, "r1", 4, None, None, "random", "", 0) for run in runs]
    index = NoveltyIndex(bfcl_data.load_tasks(split="all"))
    result = check_group(group, tiny, index, ValidatorConfig(), JSON,
                         EpisodeLimits(max_calls_per_turn=2, max_context_tokens=6144),
                         SamplingConfig(temperature=0.0, max_new_tokens=48))
    assert result.record is not None, f"dead-lettered: {result.error_type}: {result.reason}"
    record = result.record
    # its reference is explored calls, so only a noise instruction that reads like a call can make it
    # malformed; a random model's task does not hold up after
    first = record["stages"][0]
    assert first["passed"] or ("instruction: it " in first["reason"] and first["stage"] == "well_formed"), first
    assert record["verdict"] == "rejected" and record["stage"] in ("well_formed", "executable", "novel", "dual_pass")
    assert record["stages"][-1]["stage"] == record["stage"] and record["reason"].startswith(record["stage"])
    assert record["exploration_ids"] == [e["event_id"] for e in group] and record["seed_task_id"] == SEED.task_id
    name, decoded = default_registry().decode(default_registry().encode("TaskChecked", record))
    assert name == "TaskChecked" and decoded["task_id"] == record["task_id"]


def test_a_group_whose_run_chained_two_calls_becomes_a_two_call_task_in_words_that_runs_on_bfcls_backends(tiny):
    chain = [{"name": "cd", "arguments": '{"folder": "document"}', "observation": '{"current_working_directory": '
              '"document"}', "task_id": SEED.task_id},
             {"name": "ls", "arguments": "{}", "observation": '{"current_directory_content": ["final_report.pdf"]}',
              "task_id": SEED.task_id}]
    group = [{"event_id": f"e{i}", "run_id": "r1", "step": 4, "signal_id": "sig", "signal_ids": ["sig"],
              "task_id": SEED.task_id, "round": i, "context": "", "tuples": chain[:i + 1]} for i in range(2)]
    config = ValidatorConfig(instructions="calls", max_turns=2, task_calls_per_turn=1)
    result = check_group(group, tiny, NoveltyIndex(bfcl_data.load_tasks(split="all")), config, JSON,
                         EpisodeLimits(max_calls_per_turn=2, max_context_tokens=6144),
                         SamplingConfig(temperature=1.0, max_new_tokens=48), attempts=4)
    record = result.record
    assert record is not None, f"dead-lettered: {result.error_type}: {result.reason}"
    assert record["reference_solution"] == [["cd(folder='document')"], ["ls()"]]
    assert [s["stage"] for s in record["stages"]][:3] == ["well_formed", "executable", "novel"]
    assert all(s["passed"] for s in record["stages"][:3]), record["stages"]
    assert record["stages"][-1]["stage"] == "dual_pass" and "of 4 attempts" in record["stages"][-1]["reason"]
    assert all(leaked_call(turn, ["cd", "ls"]) == "" for turn in record["instruction_turns"])
    assert record["instruction_turns"][1] == "List the contents of the current directory."
    name, decoded = default_registry().decode(default_registry().encode("TaskChecked", record))
    task = Task.from_record(decoded)
    assert score_calls(task, [list(turn) for turn in task.reference])["success"]
