"""The BFCL environment on the real bfcl-eval backends: episodes, isolation, guards, scoring, split."""
from __future__ import annotations

import copy
import json
import threading
import time

import pytest

from coevolve.services.envs import Task, bfcl_data, make_env, run_episode
from coevolve.services.envs.bfcl import BfclConfig, BfclEnv, InvalidTask, reference_problems, score_calls
from coevolve.services.envs.calls import parse_action
from coevolve.services.runtime.config import ConfigError

BASE0 = "multi_turn_base_0"  # GorillaFileSystem + TwitterAPI, 4 turns


def task(task_id=BASE0):
    return bfcl_data.get_task(task_id)


def fs(env):
    return env.work.instances["GorillaFileSystem"]


def test_reset_gives_system_prompt_with_tools_then_first_user_turn():
    t = task()
    system, user = BfclEnv().reset(t)
    names = {tool["function"]["name"] for tool in system["tools"]}
    assert {"cd", "mkdir", "post_tweet"} <= names
    assert system["role"] == "system" and '"name": "mkdir"' in system["content"]
    assert system["tools"][0]["function"]["parameters"]["type"] == "object"
    assert user == {"role": "user", "content": t.turns[0]}


def test_signatures_list_each_tool_on_one_line_in_a_fraction_of_the_prompt():
    t = task()
    full, _ = BfclEnv().reset(t)
    short, user = make_env("bfcl", tool_docs="signatures").reset(t)
    assert "mkdir(dir_name: string): " in short["content"] and '"name": "mkdir"' not in short["content"]
    assert "post_tweet(content: string, tags: array = None, mentions: array = None): Post a tweet" in short["content"]
    assert "This tool belongs to" not in short["content"] and short["tools"] == full["tools"]
    assert len(short["content"]) < len(full["content"]) / 3 and user["content"] == t.turns[0]
    with pytest.raises(ConfigError, match="tool_docs='yaml': choose one of full, signatures"):
        make_env("bfcl", tool_docs="yaml")


def test_reference_calls_pass_every_turn_and_observations_follow_the_turns():
    t = task()
    env = make_env("bfcl")
    env.reset(t)
    first = env.step(list(t.reference[0]))
    assert [o["name"] for o in first.observations] == ["cd", "mkdir", "mv"]
    assert "moved to" in first.observations[2]["content"] and not first.done
    end = env.step("Moved it.")
    assert end.observations == [{"role": "user", "content": t.turns[1]}]
    assert end.info["verdict"]["passed"] and end.score == pytest.approx(0.25)
    final = run_reference_from(env, t, start=1)
    assert final.done and final.success and final.score == 1.0


def run_reference_from(env, t, start):
    result = None
    for calls in t.reference[start:]:
        env.step(list(calls))
        result = env.step("ok")
    return result


def test_partial_score_is_the_fraction_of_turns_passed():
    t = task()
    turns = [list(c) for c in t.reference]
    turns[2] = []  # sort() changes no state, so later turns can still pass
    result = score_calls(t, turns)
    assert not result["success"]
    assert [v["passed"] for v in result["turns"]] == [True, True, False, True]
    assert result["score"] == pytest.approx(0.75)
    assert result["turns"][2]["reason"] == "no tool calls in this turn"


def test_wrong_state_and_missing_results_are_reported():
    t = task()
    turns = [list(c) for c in t.reference]
    turns[0] = ["cd(folder='document')", "mkdir(dir_name='tmp')", "mv(source='final_report.pdf', destination='tmp')"]
    verdict = score_calls(t, turns)["turns"][0]
    assert not verdict["passed"] and verdict["state_differences"] == {"GorillaFileSystem": ["root"]}
    turns = [list(c) for c in t.reference]
    turns[1] = ["cd(folder='temp')"]  # state matches, the grep result is missing
    verdict = score_calls(t, turns)["turns"][1]
    assert not verdict["passed"] and len(verdict["missing_results"]) == 1


def test_json_tool_calls_score_like_call_strings():
    t = task()
    env = BfclEnv()
    env.reset(t)
    for calls in t.reference:
        parsed = parse_action(list(calls)).calls
        text = "".join(f"<tool_call>{json.dumps({'name': c.name, 'arguments': dict(c.kwargs)})}</tool_call>"
                       for c in parsed if not c.args)
        positional = [c.render() for c in parsed if c.args]
        if text:
            env.step(text)
        if positional:
            env.step("[" + ", ".join(positional) + "]")
        result = env.step("done")
    assert result.success


def test_injections_are_rejected_with_a_clear_observation_and_run_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = BfclEnv()
    env.reset(task())
    before = copy.deepcopy(vars(fs(env)))
    attempts = [
        "__import__('os').system('touch pwned1')",
        "open('pwned2', 'w')",
        "[ls(), __import__('subprocess').run(['touch', 'pwned3'])]",
        "(lambda: __import__('os').system('touch pwned4'))()",
        "lambda: __import__('os').system('touch pwned5')",
        "ls.__globals__['subprocess'].run(['touch', 'pwned6'])",
        "_load_scenario(scenario={})",
        "eval(\"__import__('os').system('touch pwned7')\")",
        "echo(content=" + "[" * 60 + "]" * 60 + ", file_name='x')",
        "echo(content='" + "x" * 30_000 + "')",
        '{"name": "__import__", "arguments": {"name": "os"}}',
    ]
    for attempt in attempts:
        result = env.step(attempt)
        rejected = [o for o in result.observations if o["content"].startswith("Invalid action")]
        assert rejected, attempt
        assert not result.done
    assert list(tmp_path.iterdir()) == []
    after = vars(fs(env))
    assert after["root"] == before["root"]


def test_backend_errors_and_bad_arguments_become_observations():
    env = BfclEnv()
    env.reset(task())
    obs = env.step("[cd(folder='document', color='red'), mkdir(), tail(file_name=3, lines='x'), rm(file_name=[1])]")
    assert len(obs.observations) == 4
    contents = [o["content"] for o in obs.observations]
    assert "unexpected keyword argument 'color'" in contents[0]
    assert contents[1].startswith("Error during execution") and "dir_name" in contents[1]
    assert all("rror" in c for c in contents[2:])
    assert not obs.done


def test_huge_computations_are_refused_before_they_run():
    env = BfclEnv()
    env.reset(Task("math", ("compute",), {}, ("MathAPI",), (("add(a=1, b=2)",),)))
    started = time.monotonic()
    obs = env.step("[power(base=10, exponent=1000000000), square_root(number=2, precision=100000000), "
                   "logarithm(value=10, base=2, precision=99999999), power(base=2, exponent=10)]")
    contents = [o["content"] for o in obs.observations]
    assert all(c.startswith("Invalid action") for c in contents[:3])
    assert json.loads(contents[3]) == {"result": 1024}
    assert time.monotonic() - started < 5


def test_unknown_functions_of_other_classes_are_not_reachable():
    env = BfclEnv()
    env.reset(task())
    obs = env.step("get_stock_info(symbol='AAPL')")
    assert "not a function of this task's tools" in obs.observations[0]["content"]


def test_concurrent_episodes_of_one_task_leave_each_other_untouched():
    t = task()
    state_before = copy.deepcopy(t.initial_state)
    a, b = BfclEnv(), BfclEnv()
    a.reset(t)
    b.reset(t)
    a.step("[cd(folder='document'), mkdir(dir_name='only_in_a')]")
    listing = b.step("[cd(folder='document'), ls()]").observations[1]["content"]
    assert "only_in_a" not in listing
    assert "only_in_a" in a.step("ls()").observations[0]["content"]
    assert t.initial_state == state_before

    results, errors = [], []

    def episode(wrong: bool):
        try:
            env = BfclEnv()
            env.reset(t)
            for turn, calls in enumerate(t.reference):
                env.step(["mkdir(dir_name='noise')"] if wrong and turn == 0 else list(calls))
                outcome = env.step("done")
            results.append((wrong, outcome.success))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=episode, args=(i % 2 == 1,)) for i in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert sorted(results) == [(False, True)] * 8 + [(True, False)] * 8


def test_step_limits_end_the_episode_and_fail_the_remaining_turns():
    env = BfclEnv(BfclConfig(max_steps_per_turn=2))
    env.reset(task())
    env.step("pwd()")
    env.step("pwd()")
    result = env.step("pwd()")
    assert result.done and not result.success and result.score == 0.0
    assert "tool-calling steps in one turn" in result.info["terminated"]
    assert [v.reason.split(":")[0] for v in env.verdicts()] == ["terminated", "not reached", "not reached", "not reached"]
    assert env.step("pwd()").done

    env = BfclEnv(BfclConfig(max_steps=3))
    env.reset(task())
    t = task()
    env.step(list(t.reference[0]))
    env.step("ok")
    env.step(list(t.reference[1]))
    env.step("ok")
    env.step("pwd()")
    result = env.step("pwd()")
    assert result.done and result.score == pytest.approx(0.5) and not result.success


def test_stepping_without_a_running_episode_is_an_observation():
    env = BfclEnv()
    result = env.step("pwd()")
    assert result.done and "call reset" in result.observations[0]["content"]
    assert env.verdicts() == [] and env.terminate("stop").done


def test_wall_clock_timeout_ends_the_episode():
    env = BfclEnv(BfclConfig(timeout_s=0.05))
    env.reset(task())
    env.step("pwd()")
    time.sleep(0.1)
    result = env.step("ls()")
    assert result.done and not result.success and "time limit" in result.info["terminated"]


def test_miss_func_turns_announce_the_added_tools():
    t = task("multi_turn_miss_func_0")
    env = BfclEnv()
    system, _ = env.reset(t)
    assert "sort" not in {x["function"]["name"] for x in system["tools"]}
    (added_turn,) = t.added_tools
    for turn in range(added_turn):
        if t.reference[turn]:
            env.step(list(t.reference[turn]))
        result = env.step("ok")
    assert result.observations[0]["role"] == "system"
    assert [x["function"]["name"] for x in result.observations[0]["tools"]] == ["sort"]
    assert result.observations[1] == {"role": "user", "content": bfcl_data.ADDED_TOOLS_PROMPT}
    assert "sort" in {x["function"]["name"] for x in env.tools()}


def test_task_record_round_trip_runs_like_the_seed_task():
    t = task("multi_turn_long_context_7")
    record = json.loads(json.dumps(t.to_record()))
    again = Task.from_record(record)
    assert again.long_context and again.turns == t.turns and again.reference == t.reference
    assert again.initial_state == t.initial_state
    assert score_calls(again, again.reference)["success"]


def test_unscored_tasks_run_but_do_not_score():
    t = Task("explore-1", ("look around",), {"GorillaFileSystem": {}}, ("GorillaFileSystem",))
    env = BfclEnv()
    env.reset(t)
    assert "current_working_directory" in env.step("pwd()").observations[0]["content"]
    result = env.step("done")
    assert result.done and result.score == 0.0 and not result.success


@pytest.mark.parametrize("bad, message", [
    (Task("x", ("hi",), {}, ("NoSuchAPI",)), "unknown tool class"),
    (Task("x", (), {}, ("MathAPI",)), "no turns"),
    (Task("x", ("hi",), {"TwitterAPI": []}, ("TwitterAPI",)), "must be an object"),
])
def test_tasks_that_cannot_run_are_refused_at_reset(bad, message):
    with pytest.raises(InvalidTask, match=message):
        BfclEnv().reset(bad)


def test_config_rejects_nonsense():
    with pytest.raises(ConfigError, match="max_steps_per_turn"):
        BfclConfig(max_steps_per_turn=0)
    with pytest.raises(ConfigError, match="timeout_s"):
        BfclConfig(timeout_s=0)


def test_held_out_split_is_fixed_half_and_half_and_shared_by_variants():
    train = bfcl_data.load_tasks(split="train")
    test = bfcl_data.load_tasks(split="test")
    assert len(train) == len(test) == 100
    assert not {t.task_id for t in train} & {t.task_id for t in test}
    assert bfcl_data.test_indices() == bfcl_data.test_indices(bfcl_data.SPLIT_SEED)
    assert bfcl_data.test_indices(1) != bfcl_data.test_indices()
    test_ids = sorted(bfcl_data.index_of(t.task_id) for t in test)
    assert test_ids[:5] == sorted(bfcl_data.test_indices())[:5]
    for t in bfcl_data.load_tasks(["multi_turn_miss_param"], split="test"):
        assert bfcl_data.split_of(t.task_id.replace("miss_param", "base")) == "test"
    with pytest.raises(ValueError):
        bfcl_data.load_tasks(split="eval")


def test_reference_problems_name_the_calls_a_synthesized_task_cannot_stand_on():
    state = {"GorillaFileSystem": {"root": {"home": {"type": "directory", "contents": {}}}}}
    sound = Task("syn-1", ("make a dir",), state, ("GorillaFileSystem",), (("mkdir(dir_name='a')",),))
    assert reference_problems(sound) == []
    bad = Task("syn-2", ("x", "y"), state, ("GorillaFileSystem",),
               (("cat(file_name='missing.txt')", "os.system('x')"), ("post_tweet(content='hi')", "mkdir()")))
    problems = reference_problems(bad)
    assert [p.split(" -> ")[0] for p in problems] == [
        "turn 0: cat(file_name='missing.txt')", "turn 0: os.system('x')",
        "turn 1: post_tweet(content='hi')", "turn 1: mkdir()"]
    assert reference_problems(Task("syn-3", ("x",), state, ("Nope",), (("ls()",),)))[0].startswith("unknown tool class")
    assert reference_problems(Task("syn-4", ("x",), state, ("GorillaFileSystem",))) == ["the task has no reference solution"]


def test_run_episode_with_a_scripted_policy_and_with_a_stubborn_one():
    t = task("multi_turn_base_2")
    outputs = iter([out for calls in t.reference for out in ([repr_calls(calls)] if calls else []) + ["Done."]])
    transcript, result = run_episode(make_env("bfcl"), t, lambda messages: next(outputs))
    assert result.done and result.success
    assert [m["role"] for m in transcript[:2]] == ["system", "user"]
    assert sum(m["role"] == "user" for m in transcript) == len(t.turns)

    transcript, result = run_episode(make_env("bfcl", max_steps_per_turn=3), t, lambda messages: "pwd()")
    assert result.done and not result.success and result.info["terminated"]


def repr_calls(calls):
    return "[" + ", ".join(calls) + "]"
