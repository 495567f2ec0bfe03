"""Every signal has somewhere to go: synthesized ids resolve from the catalog, rare signals find a task,
failing rollouts are replayed to their failure, and a second-generation task records its parent."""
import json
from types import SimpleNamespace

import pytest
from jsonschema import Draft202012Validator

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.catalog import TaskCatalog
from coevolve.services.explorer.acting import Start, act, call_schema, replay_prefix
from coevolve.services.explorer.config import ExplorerConfig
from coevolve.services.explorer.exploring import Budget, explore_plan, guided_starts, subject_task, weak_tools
from coevolve.services.explorer.planning import Cluster, SignalRef
from coevolve.services.explorer.records import exploration_record
from coevolve.services.validator.config import ValidatorConfig
from coevolve.services.validator.novelty import NoveltyIndex
from coevolve.services.validator.proposing import check_groups
from tests.agent_helpers import ScriptedBackend, byte_tokenizer
from tests.unit.test_explorer_reflection import boundary_signal
from tests.unit.test_explorer_service import CONTEXT, _backend, _plan

SAMPLING = SamplingConfig(temperature=0.0, max_new_tokens=400)
LIMITS = EpisodeLimits(max_context_tokens=100_000)
SEED = bfcl_data.get_task("multi_turn_base_0")
CHILD_ID = "synthesized_0123456789abcdef"


def _validated(task_id=CHILD_ID, parent="multi_turn_base_0", verdict="validated") -> dict:
    state = dict(SEED.initial_state)
    return {"task_id": task_id, "verdict": verdict, "source": "synthesized", "env": "bfcl",
            "instruction_turns": ["Go into the document folder."], "initial_state": json.dumps(state),
            "involved_classes": list(SEED.involved_classes), "reference_solution": [["cd(folder='document')"]],
            "seed_task_id": parent}


class _Reader:
    """Hands out the records of a topic in slices, as successive `read_to_end` calls would."""

    def __init__(self, *batches):
        self.batches = list(batches)
        self.reads = 0

    def read_to_end(self, timeout_s):
        self.reads += 1
        batch = self.batches.pop(0) if self.batches else []
        return [SimpleNamespace(name="TaskChecked", event=record) for record in batch]


def test_a_synthesized_id_resolves_from_the_catalog_reading_on_when_it_is_not_yet_known():
    reader = _Reader([], [_validated(), _validated("synthesized_rejected", verdict="rejected")])
    catalog = TaskCatalog(reader)
    assert catalog.refresh() == 0 and len(catalog) == 0
    task = catalog.get(CHILD_ID)  # unknown: the catalog reads on, then finds it
    assert task.task_id == CHILD_ID and task.turns == ("Go into the document folder.",) and reader.reads == 2
    assert catalog.get("multi_turn_base_3").task_id == "multi_turn_base_3" and reader.reads == 2
    with pytest.raises(KeyError, match="not among the 1 validated tasks on coevolve.tasks"):
        catalog.get("synthesized_rejected")
    assert catalog.lineage(CHILD_ID) == ["multi_turn_base_0"] and catalog.generation(CHILD_ID) == 1


def test_a_later_rejection_forgets_the_task_and_lineage_follows_every_generation():
    catalog = TaskCatalog()
    catalog.add(_validated())
    catalog.add(_validated("synthesized_grandchild", parent=CHILD_ID))
    assert catalog.lineage("synthesized_grandchild") == [CHILD_ID, "multi_turn_base_0"]
    assert catalog.generation("synthesized_grandchild") == 2 and catalog.generation("multi_turn_base_0") == 0
    catalog.add(_validated(verdict="rejected"))
    with pytest.raises(KeyError):
        catalog.get(CHILD_ID)


def test_a_signal_on_a_synthesized_task_is_explored_from_that_task_not_dead_lettered():
    catalog = TaskCatalog()
    catalog.add(_validated())
    config = ExplorerConfig(runs=1, calls_per_run=1)
    plan = _plan(config, boundary_signal("s1", task_id=CHILD_ID))
    out = explore_plan(plan, _backend(json.dumps(CONTEXT)), config, SAMPLING, Budget(), "m", [], catalog, LIMITS)
    assert out.rejected == [] and [r["task_id"] for r in out.records] == [CHILD_ID]
    unknown = explore_plan(_plan(config, boundary_signal("s2", task_id="synthesized_nowhere")),
                           _backend(json.dumps(CONTEXT)), config, SAMPLING, Budget(), "m", [], catalog, LIMITS)
    ((_, error_type, reason),) = unknown.rejected
    assert error_type == "no_task" and "'synthesized_nowhere'" in reason


def _rare(task_ids, pattern=("mkdir",)) -> dict:
    record = boundary_signal("r1")
    record.update(kind="rare", task_id=None, subject=" > ".join(pattern), pattern=list(pattern))
    record["evidence"].update(task_ids=list(task_ids), trajectories=[])
    return record


def test_a_rare_signal_goes_to_its_first_evidence_task_that_resolves_else_to_a_seed_task_with_its_tools():
    catalog = TaskCatalog()
    rare = Cluster((SignalRef.from_record(_rare(["synthesized_gone", "multi_turn_base_4"])),))
    assert subject_task(rare, catalog, []).task_id == "multi_turn_base_4"
    nowhere = Cluster((SignalRef.from_record(_rare(["synthesized_gone"], ("create_ticket",))),))
    seeds = ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2", "multi_turn_base_3"]
    assert subject_task(nowhere, catalog, seeds).task_id == "multi_turn_base_2"  # the one with TicketAPI
    with pytest.raises(KeyError, match="no seed task has those tools"):
        subject_task(nowhere, catalog, ["multi_turn_base_0"])


def test_the_failing_rollout_is_replayed_up_to_its_first_failing_call():
    actions = [{"name": "cd", "arguments": '{"folder": "document"}', "observation": '{"current_working_directory": "document"}'},
               {"name": "mv", "arguments": '{"source": "a", "destination": "b"}', "observation": '{"error": "mv: no"}'},
               {"name": "ls", "arguments": "{}", "observation": "{}"}]
    assert replay_prefix(actions) == ({"name": "cd", "arguments": {"folder": "document"}},)
    positional = [{"name": "cd", "arguments": '{"args": ["x"]}', "observation": "{}"}]
    assert replay_prefix(positional) == ()
    start = Start(SEED, 0, ("guidance",), ("mv",), replay_prefix(actions))
    acted = act(_backend("", '{"name": "pwd", "arguments": {}}'), [start, Start(SEED, 1)], 1, SAMPLING)
    first, second = acted.runs
    assert [c.name for c in first.calls] == ["cd", "pwd"] and "document" in first.calls[1].observation
    assert [c.name for c in second.calls] == ["pwd"] and acted.replayed == 1


def test_every_call_schema_is_a_valid_schema_and_admits_only_the_tools_with_their_argument_names():
    for cls in bfcl_data.DOC_FILES:
        Draft202012Validator.check_schema(call_schema([bfcl_data.tool_schema(d) for d in bfcl_data.function_docs(cls)]))
    tools = bfcl_data.tools_at(SEED, 0)
    validator = Draft202012Validator(call_schema(tools))
    assert validator.is_valid({"name": "cd", "arguments": {"folder": "document"}})
    assert not validator.is_valid({"name": "cd", "arguments": {"dir": "document"}})
    assert not validator.is_valid({"name": "teleport", "arguments": {}})
    assert not validator.is_valid({"name": "cd", "arguments": {"folder": "x" * 200}})


def test_a_task_made_from_a_synthesized_task_records_it_as_its_parent():
    catalog = TaskCatalog()
    catalog.add(_validated())
    call = '{"name": "cd", "arguments": {"folder": "document"}}'
    starts = [Start(catalog.get(CHILD_ID), r) for r in range(2)]
    runs = act(_backend("", call), starts, 1, SAMPLING).runs
    group = [exploration_record(run, "r1", 3, None, None, "random", "m", 1) for run in runs]
    proposal = {"turns": [{"instruction": "Go into the document folder.", "reference": ["cd(folder='document')"]}]}
    backend = ScriptedBackend(byte_tokenizer(), lambda r: json.dumps(proposal) if r.json_schema
                              else ("[cd(folder='document')]" if r.messages[-1]["role"] == "user" else "Done."))
    (checked,) = check_groups([group], backend, NoveltyIndex([SEED]), ValidatorConfig(), SAMPLING,
                              LIMITS, resolve=catalog.get)
    assert checked.record["seed_task_id"] == CHILD_ID
    (orphan,) = check_groups([group], backend, NoveltyIndex([SEED]), ValidatorConfig(), SAMPLING, LIMITS)
    assert orphan.error_type == "no_seed_task"


def test_a_tool_without_parameters_that_answered_is_not_offered_again_in_the_run():
    acted = act(_backend("", '{"name": "pwd", "arguments": {}}'), [Start(SEED, 0)], 3, SAMPLING, attempts=1)
    (run,) = acted.runs
    assert [c.name for c in run.calls] == ["pwd"] and acted.unusable == 1  # a second pwd no longer fits
    failing = act(_backend("", '{"name": "cat", "arguments": {"file_name": "none.txt"}}'), [Start(SEED, 0)], 2,
                  SAMPLING, attempts=1)
    assert [c.name for c in failing.runs[0].calls] == ["cat", "cat"]  # a tool with parameters stays offered


def test_every_guided_run_starts_at_the_weak_spot_and_round_0_replays_the_failing_rollout_to_it():
    rare = Cluster((SignalRef.from_record(_rare(["multi_turn_base_4"], ("touch",))),))
    assert weak_tools(rare, "multi_turn_base_4") == ("touch",)
    record = boundary_signal("b1")
    record["evidence"]["trajectories"][0]["actions"] = [
        {"name": "cd", "arguments": '{"folder": "document"}', "observation": '{"current_working_directory": "document"}'},
        {"name": "mv", "arguments": '{"source": "a", "destination": "b"}', "observation": '{"error": "mv: no"}'}]
    cluster = Cluster((SignalRef.from_record(record),))
    assert weak_tools(cluster, "multi_turn_base_0") == ("mv",)
    first, second = guided_starts(cluster, SEED, CONTEXT, 2, replay=True)
    assert first.prefix == ({"name": "cd", "arguments": {"folder": "document"}},) and second.prefix == ()
    assert first.first == second.first == ("mv",) and first.focus == ("mv", "mkdir")
    acted = act(_backend("", '{"name": "pwd", "arguments": {}}',  # answered wherever the schema admits it
                         '{"name": "mv", "arguments": {"source": "x", "destination": "y"}}'), [first, second], 2,
                SAMPLING)
    assert [[c.name for c in run.calls] for run in acted.runs] == [["cd", "mv", "pwd"], ["mv", "pwd"]]
