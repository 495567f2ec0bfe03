"""The run's tally of broker events, its progress line, and why silent signal kinds stayed silent."""
import pytest

from coevolve.services.run.summary import (build, silent_reasons, thresholds, unclosed_reason, untrained_reason,
                                          unvalidated_reason)
from coevolve.services.run.tally import Tally
from coevolve.services.envs import bfcl_data
from coevolve.services.run.shape import shape_line


def _trajectory(eid, task, step, score, actions=0, run="r1"):
    return {"event_id": eid, "run_id": run, "task_id": task, "step": step, "score": score,
            "actions": [{"name": "ls"}] * actions}


def test_events_count_once_and_other_runs_apart():
    tally = Tally(run_id="r1")
    assert tally.add("TrajectoryRecorded", _trajectory("a", "t1", 1, 0.5))
    assert not tally.add("TrajectoryRecorded", _trajectory("a", "t1", 1, 0.5))
    assert not tally.add("TrajectoryRecorded", _trajectory("b", "t1", 1, 0.5, run="r2"))
    assert tally.trajectories == 1 and tally.other_runs["TrajectoryRecorded"] == 1


def test_the_latest_verdict_of_a_task_stands():
    tally = Tally(run_id="r1")
    tally.add("TaskChecked", {"event_id": "v1", "task_id": "syn-1", "run_id": "r1", "step": 1,
                              "source": "synthesized", "verdict": "validated", "stage": None, "reason": "ok"})
    tally.add("TaskChecked", {"event_id": "v2", "task_id": "syn-1", "run_id": "r1", "step": 2,
                              "source": "synthesized", "verdict": "rejected", "stage": "novel", "reason": "dup"})
    assert tally.validated == 0 and len(tally.verdicts) == 1


def test_silent_kinds_are_explained_from_the_runs_own_scores_and_actions():
    tally = Tally(run_id="r1")
    for i, (task, step, score) in enumerate([("t1", 1, 0.25), ("t1", 1, 0.25), ("t2", 1, 0.0), ("t2", 1, 0.0),
                                             ("t1", 2, 0.25), ("t1", 2, 0.25)]):
        tally.add("TrajectoryRecorded", _trajectory(str(i), task, step, score))
    reasons = silent_reasons(tally, thresholds({"success_threshold": 0.2}))
    assert set(reasons) == {"forgetting", "boundary", "rare"}
    assert "3 of 3 groups scored all alike" in reasons["boundary"] and "0.250" in reasons["boundary"]
    assert "1 of 2 tasks ever reached tau" in reasons["forgetting"]
    assert "no tool call" in reasons["rare"]


def test_a_kind_that_fired_gets_no_excuse_and_the_summary_sums_the_steps():
    tally = Tally(run_id="r1")
    tally.add("TrajectoryRecorded", _trajectory("x", "t1", 1, 1.0, actions=3))
    tally.add("SignalRaised", {"event_id": "s", "run_id": "r1", "kind": "rare"})
    for step, blocked in ((1, 0.01), (2, 0.03)):
        tally.add("StepCompleted", {"event_id": f"st{step}", "run_id": "r1", "step": step, "trajectory_count": 1,
                                    "duration_seconds": 10.0, "blocked_seconds": blocked, "rollout_seconds": 6.0,
                                    "train_reward": 0.5, "pool_size": 40 + step, "pool_synthesized": step - 1})
    doc = build(tally, {"run_id": "r1"}, {"train": 20.0}, thresholds({}), "completed")
    assert "rare" not in doc["signals_silent"] and doc["signals"]["rare"] == 1
    assert doc["steps"] == 2 and doc["pool_size"] == {1: 41, 2: 42}
    assert doc["learner_seconds"]["rollout"] == 12.0 and doc["blocked_share"] == pytest.approx(0.002)
    line = tally.progress_line(2, 2)
    assert line.startswith("step 2/2  rollouts 1  reward 0.500") and "pool 42 (1 synthesized)" in line
    assert "signals forgetting 0 · boundary 0 · rare 1  explorations 0  verdicts 0 validated · 0 rejected" in line
    assert line.endswith("(rollout 6.0 s)")


def test_the_loop_closes_where_an_update_first_trains_on_a_synthesized_task():
    tally = Tally(run_id="r1")
    tally.add("StepCompleted", {"event_id": "st1", "run_id": "r1", "step": 1, "pool_synthesized": 0})
    assert unclosed_reason(tally) == "no task was validated (tasks_silent says why)"
    tally.add("TaskChecked", _verdict("a", "validated", None))
    assert "1 task(s) validated, none before the pool's last refresh (before step 1)" in unclosed_reason(tally)
    tally.add("StepCompleted", {"event_id": "st2", "run_id": "r1", "step": 2, "pool_synthesized": 1,
                                "synthesized_trained": 0, "synthesized_tasks_trained": 0})
    assert unclosed_reason(tally).startswith("synthesized tasks were in the pool from step 2, but no step's update")
    assert tally.synthesized_line(2) is None
    tally.add("StepCompleted", {"event_id": "st3", "run_id": "r1", "step": 3, "pool_synthesized": 2,
                                "synthesized_trained": 6, "synthesized_tasks_trained": 2})
    doc = build(tally, {"run_id": "r1"}, {}, thresholds({}), "completed")
    assert (doc["synthesized_trained"], doc["first_synthesized_step"], doc["loop_silent"]) == (6, 3, None)
    assert tally.synthesized_line(3) == "step 3: trained on 2 synthesized tasks (6 rollouts)"


def _verdict(eid, verdict, stage):
    return {"event_id": eid, "task_id": f"syn-{eid}", "run_id": "r1", "step": 1, "source": "synthesized",
            "verdict": verdict, "stage": stage, "reason": "why"}


def test_a_run_that_validated_nothing_says_how_far_its_proposals_got():
    tally = Tally(run_id="r1")
    tally.add("DeadLettered", {"event_id": "d1", "service": "validator", "error_type": "nothing_to_abstract"})
    assert unvalidated_reason(tally) == ("no task was proposed (0 explorations published); exploration groups "
                                         "with no proposal: 1 nothing_to_abstract")
    tally.add("TaskChecked", _verdict("a", "rejected", "dual_pass"))
    tally.add("TaskChecked", _verdict("b", "rejected", "dual_pass"))
    tally.add("TaskChecked", _verdict("c", "rejected", "novel"))
    assert unvalidated_reason(tally) == ("all 3 proposed tasks were rejected: 2 at dual_pass, 1 at novel; "
                                         "exploration groups with no proposal: 1 nothing_to_abstract")
    tally.add("TaskChecked", _verdict("d", "validated", None))
    assert unvalidated_reason(tally) is None


def test_a_run_without_a_grpo_update_says_its_groups_scored_alike():
    tally = Tally(run_id="r1")
    for i, (task, score) in enumerate([("t1", 0.0), ("t1", 0.0), ("t2", 0.5), ("t2", 0.5)]):
        tally.add("TrajectoryRecorded", _trajectory(str(i), task, 1, score))
    tally.add("StepCompleted", {"event_id": "s1", "run_id": "r1", "step": 1, "loss": None})
    reason = untrained_reason(tally)
    assert "2 of 2 groups scored all alike" in reason and "0.500" in reason
    tally.add("StepCompleted", {"event_id": "s2", "run_id": "r1", "step": 2, "loss": -0.1})
    assert untrained_reason(tally) is None


def test_a_run_of_zero_steps_says_it_only_evaluated():
    tally = Tally(run_id="r1")
    assert untrained_reason(tally) is None  # nothing yet: stopped before its first step
    tally.add("EvaluationCompleted", {"event_id": "e0", "run_id": "r1", "step": 0, "success_rate": 0.0})
    assert untrained_reason(tally) == ("no training step: run.steps = 0 evaluates the starting policy only "
                                       "(the zero-shot arm)")


def test_the_summary_gives_the_policy_lag_and_the_weight_updates():
    tally = Tally(run_id="r1")
    for step, (lag_max, lag_mean, stale) in enumerate([(0, 0.0, 0), (1, 0.75, 0), (1, 0.5, 1)], start=1):
        tally.add("StepCompleted", {"event_id": f"st{step}", "run_id": "r1", "step": step, "trajectory_count": 8,
                                    "staleness_max": lag_max, "staleness_mean": lag_mean, "stale_groups": stale})
    tally.add("StepCompleted", {"event_id": "st4", "run_id": "r1", "step": 4, "trajectory_count": 8})  # no update
    for version, seconds in ((1, 2.0), (2, 4.0), (3, 9.0), (3, 9.0)):  # the last a redelivery
        tally.add("PolicyUpdated", {"event_id": f"p{version}", "run_id": "r1", "step": version, "version": version,
                                    "bytes": 540_000_000, "seconds": seconds, "servers": 2, "servers_behind": 0})
    doc = build(tally, {"run_id": "r1", "rollout": "vllm-server"}, {}, thresholds({}), "completed")
    assert doc["rollout"] == "vllm-server"
    assert doc["policy_lag"] == {"max": 1, "mean": pytest.approx(1.25 / 3), "stale_groups": 1}
    assert doc["weight_updates"] == {"count": 3, "median_seconds": 4.0, "bytes": 540_000_000, "servers_behind": 0}


def test_a_run_without_updates_has_no_lag_and_no_weight_updates():
    doc = build(Tally(run_id="r1"), {"run_id": "r1"}, {}, thresholds({}), "completed")
    assert doc["policy_lag"] == {"max": None, "mean": None, "stale_groups": 0}
    assert doc["weight_updates"]["count"] == 0 and doc["weight_updates"]["median_seconds"] is None


def test_the_summary_sets_the_validated_tasks_shape_beside_the_seeds_and_counts_leaked_calls():
    tally = Tally(run_id="r1")
    fs = ["GorillaFileSystem"]
    for eid, turns, reference in (
            ("a", ["Go into the document folder, then list it."], [["cd(folder='document')", "ls()"]]),
            ("b", ["Run cd(folder='temp').", "Then list it."], [["cd(folder='temp')"], ["ls()"]]),
            ("c", ["List everything."], [["ls(a=True)"]])):
        tally.add("TaskChecked", {**_verdict(eid, "validated", None), "instruction_turns": turns,
                                  "reference_solution": reference, "involved_classes": fs})
    tally.add("TaskChecked", {**_verdict("d", "rejected", "well_formed"), "instruction_turns": ["x=1"],
                              "reference_solution": [["ls()"]], "involved_classes": fs})
    seed = bfcl_data.get_task("multi_turn_base_0")
    shape = build(tally, {"run_id": "r1"}, {}, thresholds({}), "completed", [seed])["task_shape"]
    assert shape["validated"] == {"tasks": 3, "calls": {1: 1, 2: 2}, "turns": {1: 2, 2: 1}, "mean_calls": 5 / 3,
                                  "mean_turns": 4 / 3, "two_or_more_calls": 2, "instructions": 4,
                                  "instructions_leaking_a_call": 1}
    assert shape["seeds"]["tasks"] == 1 and shape["seeds"]["mean_turns"] == len(seed.turns)
    assert shape_line(shape).startswith("task shape: validated 3, 1.7 calls and 1.3 turns each (2 with 2+ calls), "
                                        "instructions leaking a call 1 of 4; seeds 1, ")
