"""The random strategy: seeded random valid calls, run for real in BFCL, recorded as ExplorationRecorded."""
import json

from coevolve.schemas import default_registry
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.bfcl import public_methods, workspace
from coevolve.services.envs.calls import Call
from coevolve.services.explorer.planning import Cluster, SignalRef, exploration_id, random_source_id
from coevolve.services.explorer.random_strategy import (ExplorationRun, ValuePool, explore_randomly,
                                                        is_error_observation)
from coevolve.services.explorer.records import exploration_record

TASK = bfcl_data.get_task("multi_turn_base_0")


def test_runs_are_deterministic_for_a_seed_and_differ_across_seeds_and_rounds():
    first = explore_randomly(TASK, runs=3, calls=6, seed=7)
    assert first == explore_randomly(TASK, runs=3, calls=6, seed=7)
    assert [r.round for r in first] == [0, 1, 2]
    assert first[0].calls != first[1].calls
    assert first != explore_randomly(TASK, runs=3, calls=6, seed=8)


def test_every_call_names_a_tool_of_the_involved_classes_and_string_arguments_were_revealed_before():
    tools = set().union(*(public_methods(c) for c in TASK.involved_classes))
    for run in explore_randomly(TASK, runs=4, calls=10, seed=1):
        assert 1 <= len(run.calls) <= 10
        pool = ValuePool()
        pool.add(TASK.initial_state)
        for call in run.calls:
            assert call.name in tools
            strings = [v for v in call.arguments.values() if isinstance(v, str)]
            assert all(s in pool.strings or s == "" for s in strings), (call, list(pool.strings)[:5])
            pool.add_observation(call.observation)


def test_calls_run_for_real_from_the_initial_state_and_errors_are_observations():
    runs = explore_randomly(TASK, runs=4, calls=10, seed=3)
    observations = [c.observation for r in runs for c in r.calls]
    assert any(is_error_observation(o) for o in observations)
    assert any(not is_error_observation(o) for o in observations)
    for run in runs:  # replaying the calls on fresh backends gives the same observations
        work = workspace(TASK)
        assert [work.run(Call(c.name, (), c.arguments)) for c in run.calls] == [c.observation for c in run.calls]


def test_error_observations_add_nothing_to_the_pool():
    pool = ValuePool()
    pool.add_observation('{"error": "mv: cannot move notes.txt"}')
    pool.add_observation("Error during execution: boom")
    pool.add_observation('{"current_directory_content": ["a.txt", "b"]}')
    assert list(pool.strings) == ["current_directory_content", "a.txt", "b"]


def test_runs_become_exploration_events_that_encode_with_deterministic_ids():
    registry = default_registry()
    (run,) = explore_randomly(TASK, runs=1, calls=4, seed=0)
    unguided = exploration_record(run, "r1", 9, None, None, "random", "", 1_795_000_000_000)
    assert unguided["event_id"] == exploration_id(random_source_id("r1", 9, TASK.task_id), 0)
    assert unguided["signal_id"] is None and unguided["strategy"] == "random" and unguided["context"] == ""
    assert [t["name"] for t in unguided["tuples"]] == [c.name for c in run.calls]
    assert all(t["task_id"] == TASK.task_id and isinstance(json.loads(t["arguments"]), dict)
               for t in unguided["tuples"])
    cluster = Cluster((SignalRef.from_record({"event_id": "sig", "kind": "boundary", "run_id": "r1", "step": 9,
                                              "task_id": TASK.task_id}),))
    guided = exploration_record(run, "r1", 9, cluster, {"failure": "x"}, "signal-guided", "m", 1_795_000_000_000)
    assert guided["event_id"] == exploration_id("sig", 0) and guided["signal_ids"] == ["sig"]
    for record in (unguided, guided):
        name, decoded = registry.decode(registry.encode("ExplorationRecorded", record))
        assert name == "ExplorationRecorded" and decoded["tuples"] == record["tuples"]


def test_an_episodes_actions_become_a_run_with_the_same_tuples():
    actions = [{"name": "cd", "arguments": '{"folder": "document"}', "observation": "ok", "turn": 0},
               {"name": "ls", "arguments": "", "observation": "[]", "turn": 0},
               {"name": "bad", "arguments": "not json", "observation": "Invalid action", "turn": 0}]
    run = ExplorationRun.from_actions(TASK.task_id, 2, actions)
    assert run.round == 2 and [c.arguments for c in run.calls] == [{"folder": "document"}, {},
                                                                    {"_unparsed": "not json"}]
    assert [(t["name"], t["observation"]) for t in run.tuples()] == [(a["name"], a["observation"]) for a in actions]
