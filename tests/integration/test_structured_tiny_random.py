"""tiny-random under vLLM's grammar-constrained decoding: reflections and abstractions end in complete,
schema-valid answers (the schemas bound every string and array), so a random-weight validator turns a
real exploration into a well-formed proposal (its references are explored calls) that reaches a verdict
instead of a dead letter."""
import pytest

from coevolve.schemas.codec import default_registry
from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.structured import StructuredOutputError, generate_json
from coevolve.services.envs import bfcl_data
from coevolve.services.explorer.planning import Cluster, SignalRef
from coevolve.services.explorer.random_strategy import explore_randomly
from coevolve.services.explorer.records import exploration_record
from coevolve.services.explorer.reflection import CONTEXT_SCHEMA, context_schema, reflection_messages
from coevolve.services.validator.abstraction import abstraction_messages, group_schema, task_schema
from coevolve.services.validator.config import ValidatorConfig
from coevolve.services.validator.novelty import NoveltyIndex
from coevolve.services.validator.proposing import check_group
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
    # its reference is explored calls, so it is well formed; a random model's task does not hold up after
    assert record["stages"][0] == {"stage": "well_formed", "passed": True, "reason": record["stages"][0]["reason"]}
    assert record["verdict"] == "rejected" and record["stage"] in ("executable", "novel", "dual_pass")
    assert record["stages"][-1]["stage"] == record["stage"] and record["reason"].startswith(record["stage"])
    assert record["exploration_ids"] == [e["event_id"] for e in group] and record["seed_task_id"] == SEED.task_id
    name, decoded = default_registry().decode(default_registry().encode("TaskChecked", record))
    assert name == "TaskChecked" and decoded["task_id"] == record["task_id"]
