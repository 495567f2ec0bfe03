"""`coevolve env score` and `coevolve env show` through the real CLI app (score runs its calls in a tool host)."""
from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from coevolve.services.cli import app
from coevolve.services.envs import bfcl_data
from tests.cli_output import plain

pytestmark = pytest.mark.integration
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_score_one_task_from_a_calls_file(tmp_path):
    task = bfcl_data.get_task("multi_turn_base_3")
    good = tmp_path / "good.json"
    good.write_text(json.dumps([list(t) for t in task.reference]))
    result = invoke("env", "score", "--env", "bfcl", "--task-id", task.task_id, "--calls", str(good))
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["task_id"], out["success"], out["score"]) == (task.task_id, True, 1.0)
    assert len(out["turns"]) == len(task.turns) and all(t["passed"] for t in out["turns"])

    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps([list(task.reference[0])]))
    out = json.loads(invoke("env", "score", "--task-id", task.task_id, "--calls", str(partial)).output)
    assert not out["success"] and out["score"] == 1 / len(task.turns)


def test_score_batch_keeps_input_order_and_reports_bad_lines(tmp_path):
    ids = ["multi_turn_long_context_5", "multi_turn_base_1", "multi_turn_miss_func_9"]
    lines = [{"task_id": i, "calls": [list(t) for t in bfcl_data.get_task(i).reference]} for i in ids]
    lines.insert(1, {"task_id": "multi_turn_base_1", "calls": [[] for _ in bfcl_data.get_task("multi_turn_base_1").turns]})
    lines.append({"task_id": "no_such_task_1", "calls": []})
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    target = tmp_path / "out.jsonl"
    result = invoke("env", "score", "--batch", str(source), "--output", str(target))
    assert result.exit_code == 0, result.output
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert [o["task_id"] for o in out] == [ids[0], "multi_turn_base_1", ids[1], ids[2], "no_such_task_1", None]
    assert [o.get("success") for o in out[:4]] == [True, False, True, True]
    assert out[1]["score"] == 0.0
    assert "no BFCL multi-turn task" in out[4]["error"] and "line 6" in out[5]["error"]


def test_score_refuses_bad_input_with_a_message(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"calls": 1}))
    result = invoke("env", "score", "--task-id", "multi_turn_base_0", "--calls", str(bad))
    assert result.exit_code == 2 and "list of turns" in plain(result.output)
    too_many = tmp_path / "many.json"
    too_many.write_text(json.dumps([[]] * 9))
    result = invoke("env", "score", "--task-id", "multi_turn_base_0", "--calls", str(too_many))
    assert result.exit_code == 2 and "4 turns" in plain(result.output)
    assert invoke("env", "score", "--task-id", "multi_turn_base_0").exit_code == 2
    assert invoke("env", "score", "--env", "appworld", "--task-id", "x", "--calls", str(bad)).exit_code == 2


def test_show_prints_turns_tools_and_reference():
    task = bfcl_data.get_task("multi_turn_miss_func_0")
    result = invoke("env", "show", "--task-id", task.task_id)
    assert result.exit_code == 0, result.output
    text = result.output
    assert task.turns[0] in text and "sort (from turn 3)" in text
    assert "cd(folder='document')" in text and "(no calls)" in text and "initial state:" in text
    data = json.loads(invoke("env", "show", "--task-id", task.task_id, "--json").output)
    assert data["reference_solution"] == [list(t) for t in task.reference]
    assert data["added_tools"] == {"3": ["sort"]} and data["split"] in ("train", "test")
    assert invoke("env", "show", "--task-id", "multi_turn_base_999").exit_code == 2


def test_score_bounds_every_call_it_did_not_write(tmp_path):
    """A calls file is anyone's: a call that computes for minutes (10**(10**8) in one C call) is stopped at
    --call-limit-s with no effect, and the score goes on."""
    task = bfcl_data.get_task("multi_turn_base_31")  # MathAPI among its classes
    stalled = tmp_path / "stalled.json"
    first, *rest = [list(t) for t in task.reference]
    stalled.write_text(json.dumps([["round_number(number=1, decimal_places=-100000000)", *first], *rest]))
    started = time.monotonic()
    result = invoke("env", "score", "--task-id", task.task_id, "--calls", str(stalled), "--call-limit-s", "2")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 60  # unbounded, the call alone runs past 90 s
    out = json.loads(result.stdout)  # the tool host's restart is logged to stderr
    assert len(out["turns"]) == len(task.turns) and time.monotonic() - started > 2  # it ran, up to its limit
    assert out["turns"][1]["passed"]  # the calls after it ran on the rebuilt state
    bad = invoke("env", "score", "--task-id", task.task_id, "--calls", str(stalled), "--call-limit-s", "0")
    assert bad.exit_code != 0 and "--call-limit-s must be positive" in plain(bad.output)
