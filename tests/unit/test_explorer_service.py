"""The explorer's per-period work (`exploring.explore_plan`) with a scripted model on the real BFCL env."""
import dataclasses
import json

from jsonschema import Draft202012Validator

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.explorer.config import ExplorerConfig
from coevolve.services.explorer.exploring import Budget, explore_plan, explore_static
from coevolve.services.explorer.planning import (Plan, SignalBuffer, exploration_id, pick_random_tasks,
                                                 random_source_id)
from coevolve.services.explorer.random_strategy import is_error_observation
from coevolve.services.envs.config import SeedPoolConfig
from coevolve.services.explorer.config import ExplorerServiceConfig
from coevolve.services.runtime.config import ConfigError
from tests.agent_helpers import ScriptedBackend, byte_tokenizer
from tests.unit.test_explorer_reflection import boundary_signal

import pytest

SAMPLING = SamplingConfig(temperature=0.0, max_new_tokens=400)
LIMITS = EpisodeLimits(max_context_tokens=100_000)  # the byte tokenizer spends a token per byte
CONTEXT = {"failure": "mv into a folder that does not exist", "location": {
    "classes": ["GorillaFileSystem"], "tools": ["mkdir", "mv"], "state": "workspace/document"},
    "to_try": ["list the folder", "create temp, then move the file"]}


def _plan(config, *signals):
    buffer = SignalBuffer(config)
    for record in signals:
        buffer.add(record, now=0.0)
    (plan,) = buffer.step_completed("r1", 4, 0.0) + buffer.expire(config.step_grace_s)
    return plan


def _is_reflection(request) -> bool:
    return "failure" in (request.json_schema.get("properties") or {})


LS = '{"name": "ls", "arguments": {}}'
MV = '{"name": "mv", "arguments": {"source": "final_report.pdf", "destination": "temp"}}'


def _backend(reflection: str, *calls: str):
    """Reflections get `reflection`; an exploration call gets the first of `calls` (ls, else mv) that its
    schema admits, or the first one when none does."""
    calls = calls or (LS, MV)

    def script(request):
        if _is_reflection(request):
            return reflection
        fits = Draft202012Validator(request.json_schema).is_valid
        return next((c for c in calls if c.startswith("{") and fits(json.loads(c))), calls[0])
    return ScriptedBackend(byte_tokenizer(), script)


def test_a_guided_period_reflects_then_explores_r_runs_of_s_constrained_calls_with_deterministic_ids():
    config = ExplorerConfig(runs=2, calls_per_run=3)
    plan = _plan(config, boundary_signal("s1"))
    backend = _backend(json.dumps(CONTEXT))
    out = explore_plan(plan, backend, config, SAMPLING, Budget(), "scripted", [], limits=LIMITS)
    assert not out.rejected and out.runs == 2 and out.calls == 6 and out.tokens > 0 and out.unusable == 0
    assert [r["event_id"] for r in out.records] == [exploration_id("s1", 0), exploration_id("s1", 1)]
    record = out.records[0]
    assert json.loads(record["context"]) == CONTEXT and record["strategy"] == "signal-guided"
    assert record["signal_ids"] == ["s1"] and record["task_id"] == "multi_turn_base_0"
    # the first call is where the failing rollout went wrong (its mv); then the model's choice
    assert [t["name"] for t in record["tuples"]] == ["mv", "ls", "ls"]
    assert not any(t["observation"].startswith(("Invalid", "Error")) for t in record["tuples"][1:])
    calls = [b for b in backend.batches if not _is_reflection(b[0])]
    assert len(calls) == 3 and all(len(batch) == 2 for batch in calls)  # the R runs step together
    assert calls[0][0].json_schema["properties"]["name"] == {"const": "mv"}  # one tool: no anyOf
    last = calls[-1][0]
    assert "create temp, then move the file" in last.messages[1]["content"]
    assert "mv({" in last.messages[1]["content"] and "ls({}) ->" in last.messages[1]["content"]
    names = [option["properties"]["name"]["const"] for option in last.json_schema["anyOf"]]
    assert names[:2] == ["mv", "mkdir"] and "cat" in names  # the weak tool, the context's, then the task's


def test_guided_calls_that_never_fit_the_schema_end_their_run_and_are_counted():
    config = ExplorerConfig(runs=2, calls_per_run=3, parse_attempts=2)
    out = explore_plan(_plan(config, boundary_signal("s1")), _backend(json.dumps(CONTEXT), "mv()"), config,
                       SAMPLING, Budget(), "m", [], limits=LIMITS)
    assert out.unusable == 2 and out.calls == 0 and [r["tuples"] for r in out.records] == [[], []]


def test_an_answer_that_never_parses_is_rejected_with_the_reason_after_every_attempt():
    config = ExplorerConfig(runs=2, parse_attempts=3)
    backend = _backend("The agent should try harder.")
    out = explore_plan(_plan(config, boundary_signal("s1")), backend, config, SAMPLING, Budget(), "m", [], limits=LIMITS)
    assert out.records == [] and len(backend.batches) == 3
    ((cluster, error_type, reason),) = out.rejected
    assert cluster.signal_ids == ["s1"] and error_type == "unparseable_reflection"
    assert "no JSON object found" in reason


def test_a_context_naming_a_tool_the_task_lacks_is_rejected():
    bad = {**CONTEXT, "location": {"classes": ["GorillaFileSystem"], "tools": ["teleport"]}}
    config = ExplorerConfig(runs=1)
    out = explore_plan(_plan(config, boundary_signal("s1")), _backend(json.dumps(bad)), config, SAMPLING,
                       Budget(), "m", [], limits=LIMITS)
    assert out.records == [] and "$.location.tools[0]: 'teleport' is not one of" in out.rejected[0][2]


def test_the_run_budget_skips_the_clusters_it_cannot_afford():
    config = ExplorerConfig(runs=2, calls_per_run=2, signals_per_step=2)
    plan = _plan(config, boundary_signal("s1", task_id="multi_turn_base_0"),
                 boundary_signal("s2", task_id="multi_turn_base_1"))
    out = explore_plan(plan, _backend(json.dumps(CONTEXT)), config, SAMPLING, Budget(runs=3), "m", [], limits=LIMITS)
    assert out.runs == 2 and out.over_budget == 1 and len({r["signal_id"] for r in out.records}) == 1


def test_the_random_arm_is_the_same_model_on_random_seed_tasks_without_any_signal_context():
    config = ExplorerConfig(strategy="random", runs=2, calls_per_run=2, signals_per_step=2)
    plan = _plan(config, boundary_signal("s1"))
    tasks = ["multi_turn_base_3", "multi_turn_base_5", "multi_turn_base_7"]
    backend = _backend(json.dumps(CONTEXT))
    out = explore_plan(plan, backend, config, SAMPLING, Budget(), "smollm2", tasks, limits=LIMITS)
    assert not any(_is_reflection(batch[0]) for batch in backend.batches)  # no reflection on the signal
    assert sorted({r["task_id"] for r in out.records}) == sorted(pick_random_tasks(tasks, 2, "r1", 4, 0))
    for record in out.records:
        assert record["strategy"] == "random" and record["model"] == "smollm2" and record["context"] == ""
        assert record["signal_id"] is None and [t["name"] for t in record["tuples"]] == ["ls", "ls"]  # no weak spot
        assert record["event_id"] == exploration_id(random_source_id("r1", 4, record["task_id"]), record["round"])
    prompts = [r.messages[1]["content"] for batch in backend.batches for r in batch]
    assert not any("An agent fails here" in p or "mv into a folder" in p for p in prompts)


def test_the_random_calls_strategy_reads_no_model_and_repeats_its_ids():
    config = ExplorerConfig(strategy="random-calls", runs=2, calls_per_run=3, signals_per_step=2)
    plan = _plan(config, boundary_signal("s1"))
    tasks = ["multi_turn_base_3", "multi_turn_base_5", "multi_turn_base_7"]
    first = explore_plan(plan, None, config, SAMPLING, Budget(), "", tasks, limits=LIMITS)
    again = explore_plan(plan, None, config, SAMPLING, Budget(), "", tasks, limits=LIMITS)
    assert len(first.records) == 4
    assert [(r["event_id"], r["tuples"]) for r in first.records] == [(r["event_id"], r["tuples"]) for r in again.records]
    for record in first.records:
        assert record["strategy"] == "random-calls" and record["signal_id"] is None and record["context"] == ""
        assert record["task_id"] in tasks and 1 <= len(record["tuples"]) <= 3
        source = random_source_id("r1", 4, record["task_id"], "random-calls")
        assert record["event_id"] == exploration_id(source, record["round"])


def test_the_static_strategy_explores_its_tasks_once_at_start_and_nothing_during_training():
    config = ExplorerConfig(strategy="static", static_tasks=2, runs=2, calls_per_run=3, fallback_tasks=1)
    tasks = ["multi_turn_base_3", "multi_turn_base_5", "multi_turn_base_7"]
    start = Plan("r1", 0, 0, (), 0, 0, "start")
    first = explore_static(start, config, Budget(), tasks)
    again = explore_static(start, config, Budget(), tasks)  # a restarted explorer sends the same ids
    assert len(first.records) == 4 and len({r["task_id"] for r in first.records}) == 2
    assert [(r["event_id"], r["tuples"]) for r in first.records] == [(r["event_id"], r["tuples"]) for r in again.records]
    assert {(r["strategy"], r["step"], r["run_id"]) for r in first.records} == {("static", 0, "r1")}
    during = explore_plan(_plan(config, boundary_signal("s1")), None, config, SAMPLING, Budget(), "", tasks, limits=LIMITS)
    assert during.records == [] and not during.fell_back  # no signal, and no fallback, is explored


def test_the_static_strategy_passes_over_a_task_whose_calls_all_fail_so_each_group_can_become_a_task():
    # Seeded random calls on multi_turn_base_26 all fail: the validator would dead-letter that group, and
    # the learner would wait out static_wait_s for a verdict that never comes.
    config = ExplorerConfig(strategy="static", static_tasks=2, runs=2, calls_per_run=3)
    tasks = ["multi_turn_base_26", "multi_turn_base_3", "multi_turn_base_5"]
    out = explore_static(Plan("r1", 0, 0, (), 0, 0, "start"), config, Budget(), tasks)
    by_task: dict[str, list] = {}
    for record in out.records:
        by_task.setdefault(record["task_id"], []).extend(record["tuples"])
    assert set(by_task) == {"multi_turn_base_3", "multi_turn_base_5"}
    assert all(any(not is_error_observation(t["observation"]) for t in calls) for calls in by_task.values())
    alone = explore_static(Plan("r1", 0, 0, (), 0, 0, "start"), config, Budget(), tasks[:1])
    assert alone.records == []  # tried, and nothing the validator could use is published


def test_a_period_with_no_signal_explored_falls_back_to_seeded_random_tasks_apart_from_guided_ones():
    config = ExplorerConfig(runs=2, calls_per_run=2, fallback_tasks=2)
    plan = _plan(config, boundary_signal("s1"))
    tasks = ["multi_turn_base_3", "multi_turn_base_5", "multi_turn_base_7"]
    out = explore_plan(plan, _backend("no JSON here"), config, SAMPLING, Budget(), "m", tasks, limits=LIMITS)
    again = explore_plan(plan, _backend("no JSON here"), config, SAMPLING, Budget(), "m", tasks, limits=LIMITS)
    assert out.rejected and out.fell_back and len(out.records) == 4  # 2 tasks x 2 runs
    assert [r["event_id"] for r in out.records] == [r["event_id"] for r in again.records]
    picked = pick_random_tasks(tasks, 2, "r1", 4, config.random_seed)
    assert sorted({r["task_id"] for r in out.records}) == sorted(picked)
    for record in out.records:
        assert record["strategy"] == "random-fallback" and record["signal_id"] is None
        source = random_source_id("r1", 4, record["task_id"], "random-fallback")
        assert record["event_id"] == exploration_id(source, record["round"])
        assert source != random_source_id("r1", 4, record["task_id"])  # apart from the random strategy's


def test_a_step_without_signals_falls_back_and_a_guided_period_falls_back_only_if_no_call_succeeded():
    config = ExplorerConfig(runs=1, fallback_tasks=1, step_grace_s=0)
    buffer = SignalBuffer(config)
    (empty,) = buffer.step_completed("r1", 7, 0.0)
    out = explore_plan(empty, None, config, SAMPLING, Budget(), "", ["multi_turn_base_9"], limits=LIMITS)
    assert [(r["strategy"], r["task_id"], r["step"]) for r in out.records] == [
        ("random-fallback", "multi_turn_base_9", 7)]
    explored = explore_plan(_plan(config, boundary_signal("s1")), _backend(json.dumps(CONTEXT)), config,
                            SAMPLING, Budget(), "m", ["multi_turn_base_9"], limits=LIMITS)
    assert not explored.fell_back and {r["strategy"] for r in explored.records} == {"signal-guided"}
    silent = _backend(json.dumps(CONTEXT), "I cannot.")
    failed = explore_plan(_plan(config, boundary_signal("s1")), silent, config, SAMPLING, Budget(), "m",
                          ["multi_turn_base_9"], limits=LIMITS)  # explored, but no call succeeded: fall back too
    assert failed.fell_back and [r["strategy"] for r in failed.records] == ["signal-guided", "random-fallback"]
    off = dataclasses.replace(config, fallback_tasks=0)
    assert explore_plan(empty, None, off, SAMPLING, Budget(), "", ["multi_turn_base_9"], limits=LIMITS).records == []


def test_negative_period_limits_are_refused():
    with pytest.raises(ConfigError, match="period limits"):
        ExplorerServiceConfig(max_runs_per_period=-1)


def test_the_seed_pool_setting_is_checked():
    with pytest.raises(ConfigError, match=r"seed_tasks=-1 must be >= 0 \(0 takes all\)"):
        SeedPoolConfig(seed_tasks=-1)
    with pytest.raises(ConfigError, match="categories is empty; name at least one BFCL category"):
        SeedPoolConfig(categories=" , ")
