"""Explorer planning: per-period budget, priority, clusters, skipped counts, config and ids."""
import pytest

from coevolve.services.runtime.config import ConfigError, describe, load
from coevolve.services.explorer.config import ExplorerConfig
from coevolve.services.explorer.planning import (SignalBuffer, SignalRef, choose, cluster_signals, exploration_id,
                                                 pick_random_tasks, random_source_id)


def signal(event_id, kind, step=3, task_id="t1", produced_at=0, run_id="r1"):
    record = {"event_id": event_id, "kind": kind, "run_id": run_id, "step": step, "produced_at": produced_at,
              "subject": task_id if kind != "rare" else "mv", "task_id": task_id if kind != "rare" else None,
              "evidence": {"task_ids": [task_id] if kind == "rare" else []}}
    return record


def refs(*records):
    return [SignalRef.from_record(r, i) for i, r in enumerate(records)]


def test_forgetting_comes_before_boundary_before_rare_and_ties_go_to_the_most_recent():
    signals = refs(signal("rare", "rare", task_id="a"), signal("b-old", "boundary", 2, "b"),
                   signal("b-new", "boundary", 3, "c"), signal("f", "forgetting", 1, "d"),
                   signal("b-same-step-later", "boundary", 3, "e", produced_at=5))
    order = [c.source_id for c in cluster_signals(signals)]
    assert order == ["f", "b-same-step-later", "b-new", "b-old", "rare"]


def test_a_tasks_forgetting_and_boundary_signals_form_one_cluster_named_by_the_forgetting_one():
    signals = refs(signal("b", "boundary", task_id="t"), signal("f", "forgetting", task_id="t"),
                   signal("r", "rare", task_id="t"))
    clusters = cluster_signals(signals)
    assert [c.signal_ids for c in clusters] == [["f", "b"], ["r"]]
    assert clusters[0].task_id == "t" and clusters[1].task_id == "t"  # rare: the task its evidence names
    assert [c.signal_ids for c in cluster_signals(signals, by_task=False)] == [["f"], ["b"], ["r"]]


def test_the_budget_explores_the_first_clusters_and_counts_the_rest_as_skipped():
    config = ExplorerConfig(signals_per_step=2, signal_kinds="forgetting,boundary")
    signals = refs(signal("f1", "forgetting", task_id="a"), signal("b1", "boundary", task_id="a"),
                   signal("b2", "boundary", task_id="b"), signal("b3", "boundary", task_id="c"),
                   signal("r1", "rare"), signal("r2", "rare"))
    chosen, skipped, ignored = choose(signals, config)
    assert [c.signal_ids for c in chosen] == [["f1", "b1"], ["b3"]]
    assert (skipped, ignored) == (1, 2)


def test_a_period_closes_on_the_step_completed_of_its_last_step():
    buffer = SignalBuffer(ExplorerConfig(every_steps=10, signals_per_step=1, step_grace_s=0))
    for i, step in enumerate((0, 5, 9, 10)):
        assert buffer.add(signal(f"s{i}", "boundary", step, f"t{i}"), now=0.0)
    assert buffer.step_completed("r1", 8, 0.0) == [] and buffer.step_completed("other-run", 9, 0.0) == []
    (plan,) = buffer.step_completed("r1", 9, 0.0)
    assert (plan.first_step, plan.last_step, plan.closed_by) == (0, 9, "step")
    assert [c.source_id for c in plan.chosen] == ["s2"] and plan.skipped == 2
    assert buffer.pending == 1


def test_a_period_without_its_step_completed_closes_when_the_window_runs_out():
    buffer = SignalBuffer(ExplorerConfig(step_window_s=60))
    buffer.add(signal("a", "rare", 1), now=100.0)
    buffer.add(signal("b", "rare", 2), now=150.0)
    assert buffer.expire(159.0) == []
    (plan,) = buffer.expire(160.0)
    assert (plan.first_step, plan.closed_by, [c.source_id for c in plan.chosen]) == (1, "window", ["a"])


def test_signals_that_arrive_after_their_steps_step_completed_join_the_period_within_the_grace():
    buffer = SignalBuffer(ExplorerConfig(step_grace_s=5))
    assert buffer.step_completed("r1", 3, 10.0) == []  # one poll handed the StepCompleted over first
    buffer.add(signal("a", "boundary", 3, "t1"), 10.0)
    buffer.add(signal("b", "rare", 3), 12.0)  # a rare signal is raised once the step's counts are in
    assert buffer.expire(14.9) == [] and buffer.waiting
    (plan,) = buffer.expire(15.0)
    assert plan.closed_by == "step" and plan.gathered == 2 and not buffer.waiting
    assert [c.source_id for c in plan.chosen] == ["a", "b"]


def test_a_signal_for_a_period_already_closed_opens_it_again_due_after_the_grace():
    buffer = SignalBuffer(ExplorerConfig(step_grace_s=5))
    buffer.add(signal("a", "boundary", 3, "t1"), 0.0)
    (first,) = buffer.step_completed("r1", 3, 0.0) + buffer.expire(5.0)
    buffer.add(signal("late", "boundary", 3, "t2"), 20.0)
    assert buffer.expire(24.0) == []
    (second,) = buffer.expire(25.0)
    assert [c.source_id for c in first.chosen] == ["a"] and [c.source_id for c in second.chosen] == ["late"]


def test_with_a_fallback_a_step_without_signals_closes_into_an_empty_plan_once():
    quiet = SignalBuffer(ExplorerConfig(step_grace_s=0))
    assert quiet.step_completed("r1", 3, 0.0) == [] and not quiet.waiting  # no fallback: nothing to do
    buffer = SignalBuffer(ExplorerConfig(step_grace_s=0, fallback_tasks=2, every_steps=2))
    assert buffer.step_completed("r1", 2, 0.0) == []  # step 2 does not end its period (2-3)
    (plan,) = buffer.step_completed("r1", 3, 0.0)
    assert (plan.first_step, plan.last_step, plan.gathered, plan.chosen) == (2, 3, 0, ())
    assert buffer.step_completed("r1", 3, 1.0) == []  # a redelivered StepCompleted plans nothing again


def test_a_redelivered_signal_is_dropped():
    buffer = SignalBuffer(ExplorerConfig(step_grace_s=0))
    assert buffer.add(signal("a", "boundary"), 0.0) and not buffer.add(signal("a", "boundary"), 1.0)
    (plan,) = buffer.step_completed("r1", 3, 1.0)
    assert not buffer.add(signal("a", "boundary"), 2.0) and buffer.pending == 0
    assert len(plan.chosen) == 1


def test_exploration_ids_follow_from_the_source_and_the_round_only():
    assert exploration_id("sig", 0) == exploration_id("sig", 0)
    assert len({exploration_id("sig", 0), exploration_id("sig", 1), exploration_id("other", 0)}) == 3
    assert random_source_id("r", 1, "t") == random_source_id("r", 1, "t") != random_source_id("r", 2, "t")


def test_unguided_task_picks_are_seeded():
    tasks = [f"t{i}" for i in range(20)]
    picked = pick_random_tasks(tasks, 3, "r1", 4, seed=0)
    assert picked == pick_random_tasks(list(reversed(tasks)), 3, "r1", 4, seed=0) and len(set(picked)) == 3
    assert sorted(pick_random_tasks(tasks, 50, "r1", 4, seed=0)) == sorted(tasks)


@pytest.mark.parametrize("overrides,message", [
    ({"strategy": "greedy"}, "strategy='greedy' is not one of signal-guided, random"),
    ({"signal_kinds": "boundary,lucky"}, "unknown: lucky"),
    ({"signal_kinds": " , "}, "none given"),
    ({"signals_per_step": 0}, "signals_per_step=0 must be at least 1"),
    ({"step_window_s": 0.0}, "step_window_s=0.0 must be positive"),
])
def test_invalid_config_says_how_to_fix_it(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ExplorerConfig(**overrides)


def test_config_layers_environment_over_defaults_and_documents_every_field():
    config = load(ExplorerConfig, "explorer", environ={"EXPLORER_STRATEGY": "random", "SIGNAL_KINDS": "rare",
                                                       "EXPLORER_EVERY_STEPS": "10"})
    assert (config.strategy, config.kinds, config.every_steps) == ("random", frozenset({"rare"}), 10)
    assert all(text for _, _, text in describe(ExplorerConfig))
