"""Validation stages with handcrafted tasks: each is rejected at the right stage, with its reason."""
import dataclasses

import pytest

from coevolve.schemas import default_registry
from coevolve.services.runtime.config import ConfigError
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import score_calls
from coevolve.services.validator.config import ValidatorConfig
from coevolve.services.validator.novelty import NoveltyIndex
from coevolve.services.validator.stages import check_executable, check_well_formed
from coevolve.services.validator.verdict import NO_VALIDATION, attempt_calls, validate, verdict_record

SEED = bfcl_data.get_task("multi_turn_base_0")
FS_STATE = {"GorillaFileSystem": SEED.initial_state["GorillaFileSystem"]}
NOW = 1_795_000_000_000


def fs_task(turns, reference, task_id="synthesized_test", state=FS_STATE, classes=("GorillaFileSystem",)):
    return Task(task_id, tuple(turns), state, classes, tuple(tuple(t) for t in reference))


VALID = fs_task(["Go into the document folder and create a folder named drafts.",
                 "Copy previous_report.pdf into drafts."],
                [["cd(folder='document')", "mkdir(dir_name='drafts')"],
                 ["cp(source='previous_report.pdf', destination='drafts')"]], "synthesized_valid")
NO_SUCH_TOOL = fs_task(["Teleport the final report to the archive."],
                       [["cd(folder='document')", "teleport(file='final_report.pdf', to='archive')"]])
GHOST_FILE = fs_task(["Move notes.txt into the archive folder."], [["mv(source='notes.txt', destination='archive')"]])
SAME_AS_SEED = Task("synthesized_dup", ("Put the final report in a new temp folder.",) + SEED.turns[1:],
                    SEED.initial_state, SEED.involved_classes, SEED.reference)
REWORDED_SEED = fs_task([SEED.turns[0].replace("Make sure", "make sure"), *SEED.turns[1:]], [["ls()"]] * 4)
ZERO_ATTEMPT = fs_task(["Create a folder named drafts in the document folder."],
                       [["cd(folder='document')", "mkdir(dir_name='drafts')"]], "synthesized_zero")


class Attempts:
    """Stands in for the validator agent: fixed attempts per task (each calls per turn; by default one
    attempt that plays the reference), and a record of who was asked."""

    def __init__(self, calls):
        self.calls, self.asked = calls, []

    def __call__(self, task):
        self.asked.append(task.task_id)
        return self.calls.get(task.task_id, [task.reference])


@pytest.fixture(scope="module")
def seeds():
    return bfcl_data.load_tasks(bfcl_data.CATEGORIES)


def run(task, seeds, attempt_calls=None, config=ValidatorConfig()):
    attempts = Attempts(attempt_calls or {})
    index = NoveltyIndex(seeds, config.similarity_threshold)
    return validate(task, index, attempts, config), attempts, index


def test_a_valid_task_passes_every_stage_in_order(seeds):
    verdict, attempts, index = run(VALID, seeds, {VALID.task_id: [[["cd(folder='document')",
                                                                    "mkdir(dir_name='drafts')"], ["ls()"]]]})
    assert verdict.validated and verdict.stage is None and attempts.asked == [VALID.task_id]
    assert [s.stage for s in verdict.stages] == ["well_formed", "executable", "novel", "dual_pass"]
    assert all(s.passed for s in verdict.stages) and verdict.score == 0.5
    assert verdict.reason == ("passed well_formed, executable, novel, dual_pass; attempt scored 0.50 "
                              "(1 of 2 turns passed): a positive partial score")
    copy = dataclasses.replace(VALID, task_id="synthesized_copy")
    assert index.check(copy).reason.startswith(f"duplicate of {VALID.task_id}")  # it joined the index
    assert index.check(VALID).passed  # and is never its own duplicate


@pytest.mark.parametrize("task,stage,reason", [
    (NO_SUCH_TOOL, "well_formed", "turn 0: 'teleport' is not a tool of GorillaFileSystem"),
    (GHOST_FILE, "executable", "the reference fails: turn 0: mv(source='notes.txt', destination='archive') -> "
                               "{\"error\": \"mv: cannot move 'notes.txt': No such file or directory\"}"),
    (SAME_AS_SEED, "novel", "duplicate of multi_turn_base_0: the same reference calls on the same initial state"),
    (REWORDED_SEED, "novel", "near-duplicate of multi_turn_base_0: instructions 100.0% similar (threshold 90)"),
])
def test_a_bad_task_is_rejected_at_its_stage_and_no_attempt_is_made(seeds, task, stage, reason):
    verdict, attempts, _ = run(task, seeds)
    assert not verdict.validated and verdict.stage == stage
    assert verdict.stages[-1].reason == reason and verdict.reason == f"{stage}: {reason}"
    assert all(s.passed for s in verdict.stages[:-1]) and attempts.asked == []


def test_a_task_whose_attempt_scores_zero_is_rejected_at_the_dual_pass(seeds):
    verdict, attempts, index = run(ZERO_ATTEMPT, seeds, {ZERO_ATTEMPT.task_id: [[["ls()"]]]})
    assert (verdict.validated, verdict.stage, verdict.score) == (False, "dual_pass", 0.0)
    assert verdict.stages[-1].reason == ("attempt scored 0.00 (0 of 1 turns passed); turn 0: state differs from "
                                         "the reference: GorillaFileSystem.root")
    assert index.check(ZERO_ATTEMPT).passed  # a rejected task does not join the index


def test_the_dual_pass_keeps_a_task_when_any_of_its_attempts_earns_a_score(seeds):
    tries = [[["ls()"]], [["cd(folder='document')", "mkdir(dir_name='drafts')"]], [["pwd()"]]]
    verdict, attempts, _ = run(ZERO_ATTEMPT, seeds, {ZERO_ATTEMPT.task_id: tries})
    assert verdict.validated and verdict.score == 1.0 and attempts.asked == [ZERO_ATTEMPT.task_id]
    assert verdict.stages[-1].reason == ("best of 3 attempts scored 1.00 (1 of 1 turns passed; scores 0.00, 1.00, "
                                         "0.00): the attempt completes the task")
    verdict, _, _ = run(ZERO_ATTEMPT, seeds, {ZERO_ATTEMPT.task_id: [tries[0], tries[2]]})
    assert not verdict.validated and verdict.stages[-1].reason.startswith(
        "best of 2 attempts scored 0.00 (0 of 1 turns passed; scores 0.00, 0.00); turn 0: state differs")
    verdict, _, _ = run(ZERO_ATTEMPT, seeds, {ZERO_ATTEMPT.task_id: []})
    assert (verdict.validated, verdict.stages[-1].reason) == (False, "no attempt was made")


def test_a_reference_that_changes_nothing_and_returns_nothing_is_not_executable():
    quiet = Task("synthesized_quiet", ("Show the comments on tweet 2.",), {"TwitterAPI": SEED.initial_state["TwitterAPI"]},
                 ("TwitterAPI",), (("get_tweet_comments(tweet_id=2)",),))
    outcome = check_executable(quiet)
    assert (outcome.passed, outcome.reason) == (False, "the reference changes no state and returns no information")


@pytest.mark.parametrize("reference,reason", [
    ([[]], "every user turn needs at least one reference call"),
    ([["os.system('ls')"]], "turn 0: \"os.system('ls')\" does not parse as one call: only plain function names"),
    ([["ls(path=open('x'))"]], "turn 0: \"ls(path=open('x'))\" does not parse as one call: call expressions"),
    ([["ls(); pwd()"]], "turn 0: 'ls(); pwd()' does not parse as one call"),
])
def test_references_that_do_not_parse_as_plain_calls_are_not_well_formed(reference, reason):
    outcome = check_well_formed(fs_task(["List files."], reference))
    assert not outcome.passed and outcome.reason.startswith(reason)


def test_without_validation_only_well_formedness_is_checked(seeds):
    config = ValidatorConfig(validation=False)
    verdict, attempts, _ = run(GHOST_FILE, seeds, config=config)
    assert verdict.validated and verdict.reason == NO_VALIDATION and attempts.asked == []
    assert not run(NO_SUCH_TOOL, seeds, config=config)[0].validated


def test_verdicts_become_task_checked_events_and_validated_tasks_replay_like_seed_tasks(seeds):
    registry = default_registry()
    index = NoveltyIndex(seeds)
    attempts = Attempts({ZERO_ATTEMPT.task_id: [[["ls()"]]]})
    verdicts = [validate(t, index, attempts, ValidatorConfig())
                for t in (VALID, NO_SUCH_TOOL, GHOST_FILE, SAME_AS_SEED, ZERO_ATTEMPT)]
    records = [verdict_record(v, "r1", 10, SEED.task_id, ["sig"], ["e0", "e1"], NOW) for v in verdicts]
    assert [(r["verdict"], r["stage"]) for r in records] == [
        ("validated", None), ("rejected", "well_formed"), ("rejected", "executable"), ("rejected", "novel"),
        ("rejected", "dual_pass")]
    assert records[0]["event_id"] == verdict_record(verdicts[0], "r1", 10, SEED.task_id, ["sig"], ["e0", "e1"],
                                                    NOW + 5)["event_id"]
    for record in records:
        name, decoded = registry.decode(registry.encode("TaskChecked", record))
        assert decoded["stages"] == record["stages"] and decoded["seed_task_id"] == SEED.task_id
        if decoded["verdict"] == "validated":
            task = Task.from_record(decoded)
            assert task == VALID
            assert score_calls(task, [list(t) for t in task.reference])["success"]


@pytest.mark.parametrize("overrides,message", [({"similarity_threshold": 0.0}, "must be in \\(0, 100\\]"),
                                               ({"max_turns": 0}, "max_turns=0 must be at least 1"),
                                               ({"instructions": "llm"}, "choose model or calls")])
def test_invalid_validator_config_says_how_to_fix_it(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ValidatorConfig(**overrides)


def test_an_episodes_actions_become_the_attempt_the_dual_pass_scores(seeds):
    actions = [{"name": "cd", "arguments": '{"folder": "document"}', "observation": "", "turn": 0},
               {"name": "mkdir", "arguments": '{"dir_name": "drafts"}', "observation": "", "turn": 0},
               {"name": "ls", "arguments": "{}", "observation": "", "turn": 1}]
    calls = attempt_calls(actions, len(VALID.turns))
    assert calls == [["cd(folder='document')", "mkdir(dir_name='drafts')"], ["ls()"]]
    verdict = validate(VALID, NoveltyIndex(seeds), lambda task: [attempt_calls(actions, len(task.turns))],
                       ValidatorConfig())
    assert verdict.validated and verdict.score == 0.5


@pytest.mark.parametrize("state,reason", [
    ({"GorillaFileSystem": "not an object"}, "initial state of GorillaFileSystem must be an object"),
    ({"GorillaFileSystem": {"root": 7}}, "cannot load the initial state of GorillaFileSystem"),
])
def test_a_task_whose_state_cannot_load_is_malformed_even_with_validation_off(seeds, state, reason):
    task = dataclasses.replace(VALID, task_id="synthesized_unloadable", initial_state=state)
    verdict, attempts, _ = run(task, seeds, {}, ValidatorConfig(validation=False))
    assert not verdict.validated and verdict.stage == "well_formed" and reason in verdict.reason
    assert attempts.asked == []
