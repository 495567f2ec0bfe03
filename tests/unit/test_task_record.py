"""A task read back from its `TaskChecked` event is the task that was judged: the same environment state
and the same reference results, for every BFCL seed task (state key order included: the file system
roots itself at the first key of `root`)."""
import json

import pytest

from coevolve.schemas import default_registry
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import _parse_reference
from coevolve.services.envs.tools import LocalWorkspace
from coevolve.services.validator.stages import StageOutcome
from coevolve.services.validator.verdict import Verdict, verdict_record

PASSED = (StageOutcome("well_formed", True, "parses"),)


def through_the_event(task: Task) -> Task:
    """The task as the learner, the catalog and the archive get it: a validated verdict's event, Avro-encoded
    and decoded by the schema registry."""
    record = verdict_record(Verdict(task, True, PASSED), "r1", 1, task.task_id, [], [], 1_795_000_000_000)
    name, decoded = default_registry().decode(default_registry().encode("TaskChecked", record))
    assert name == "TaskChecked"
    return Task.from_record(decoded)


def differences(task: Task, other: Task) -> list[str]:
    """Where `other` runs differently from `task`: loaded state, then each reference call's result and the
    state after every turn."""
    mine, theirs = LocalWorkspace(task), LocalWorkspace(other)
    problems = [f"initial {cls}.{attr}" for cls, attrs in theirs.state_differences(mine).items() for attr in attrs]
    for turn, calls in enumerate(task.reference):
        for source, call in zip(calls, _parse_reference(tuple(calls))):
            expected, got = mine.run(call), theirs.run(call)
            if expected != got:
                problems.append(f"turn {turn}: {source} gave {got[:80]!r}, not {expected[:80]!r}")
        problems += [f"after turn {turn}: {cls}.{attr}"
                     for cls, attrs in theirs.state_differences(mine).items() for attr in attrs]
    return problems


@pytest.mark.parametrize("category", bfcl_data.CATEGORIES)
def test_every_seed_task_reads_back_from_its_event_as_the_task_that_was_judged(category):
    for task in bfcl_data.load_category(category):
        back = through_the_event(task)
        assert (back.turns, back.reference, back.involved_classes) == (task.turns, task.reference,
                                                                        task.involved_classes)
        assert json.dumps(back.initial_state) == json.dumps(task.initial_state), task.task_id
        assert differences(task, back) == [], task.task_id


def test_a_root_listed_out_of_order_keeps_its_root():
    task = bfcl_data.get_task("multi_turn_miss_param_5")
    roots = list(task.initial_state["GorillaFileSystem"]["root"])
    assert roots != sorted(roots)  # the case the sorted state got wrong: rooted at `archive`
    assert list(through_the_event(task).initial_state["GorillaFileSystem"]["root"]) == roots


def test_sorted_keys_would_make_another_task():
    """What the comparison catches: the same state with its keys sorted loads another file system."""
    task = bfcl_data.get_task("multi_turn_miss_param_5")
    sorted_state = json.loads(json.dumps(task.initial_state, sort_keys=True))
    other = Task(task.task_id, task.turns, sorted_state, task.involved_classes, task.reference)
    assert differences(task, other)
