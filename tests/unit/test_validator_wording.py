"""Instructions in a user's words: a leaked call is rejected with its reason, and the instructions written
from the tools' descriptions never leak one, for any reference turn of BFCL."""
import pytest

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.tools import public_methods
from coevolve.services.validator.stages import check_well_formed
from coevolve.services.validator.wording import describe_turn, leaked_call, say_value

SEED = bfcl_data.get_task("multi_turn_base_0")
FS_TOOLS = public_methods("GorillaFileSystem")


@pytest.mark.parametrize("instruction, found", [
    ("Please run cd(folder='Documents').", "spells out a call ('cd(')"),
    ("Call ls () in the current folder.", "spells out a call ('ls (')"),
    ("Use get_stock_info(symbol) for NVDA.", "spells out a call ('get_stock_info(')"),
    ("List the folder with a=True.", "name=value syntax ('a=T')"),
    ("Set folder = 'Documents' and go there.", "name=value syntax (\"folder = '\")"),
])
def test_an_instruction_that_spells_out_a_call_is_caught_with_the_reason(instruction, found):
    assert found in leaked_call(instruction, FS_TOOLS)


@pytest.mark.parametrize("instruction", [
    "Go into Documents and list everything there, hidden files included.",
    "Show the size in human-readable format (e.g., KB, MB) of the current folder.",
    "Is 3 == 3? Then touch a file named notes.txt.",
    'Write content to a file (the content to write: "x=1, then f(2)"; the name of the file: "a=b.txt").',
])
def test_a_request_in_words_passes(instruction):
    assert leaked_call(instruction, FS_TOOLS) == ""


def test_the_well_formed_stage_rejects_a_task_whose_instruction_leaks_a_call():
    task = Task("synthesized_leak", ("Please change the directory (folder='document').",), SEED.initial_state,
                SEED.involved_classes, (("cd(folder='document')",),))
    outcome = check_well_formed(task)
    assert not outcome.passed
    assert outcome.reason.startswith("turn 0's instruction: it uses name=value syntax (\"folder='\")")


def test_instructions_written_from_the_docs_never_leak_a_call_for_any_bfcl_reference_turn():
    written = 0
    for category in bfcl_data.CATEGORIES:
        for task in bfcl_data.load_category(category):
            tools = {m for cls in task.involved_classes for m in public_methods(cls)}
            for calls in filter(None, task.reference):
                text = describe_turn(calls, task.involved_classes)
                assert leaked_call(text, tools) == "", (task.task_id, calls, text)
                written += 1
    assert written > 2500


def test_a_turn_reads_as_one_sentence_with_the_values_a_user_would_give():
    assert describe_turn(["ls(a=True)", "cd(folder='..')"], SEED.involved_classes) == (
        "List the contents of the current directory (show hidden files and directories: yes), then change the "
        'current working directory to the specified folder (the folder of the directory to change to: "..").')
    assert describe_turn(["sort('final_report.pdf')"], SEED.involved_classes) == (
        'Sort the contents of a file line by line (the name of the file appeared at current directory to sort: '
        '"final_report.pdf").')
    assert [say_value(v) for v in (False, None, [1, "a"], {"k": 2.5}, [])] == ["no", "none", '1, "a"', "k 2.5", "none"]
