"""Origin, targeting, repair and lineage on a small hand-made run whose answers are known."""
from coevolve.services.run.mechanism import Mechanism, call_names, evidence_tools
from coevolve.services.run.summary import origin_line
from coevolve.services.run.tally import Tally

TH = {"success_threshold": 0.5, "window": 5, "rare_threshold": 10.0, "pattern_length": 1}


def _signal(event_id, kind, step, task_id, scores=(), rollouts=(), pattern=()):
    return {"event_id": event_id, "kind": kind, "run_id": "r", "step": step, "task_id": task_id,
            "subject": task_id or " > ".join(pattern), "pattern": list(pattern), "thresholds": TH,
            "evidence": {"scores": list(scores), "attempt_score": sum(scores) / len(scores) if scores else None,
                         "trajectories": [{"task_id": task_id, "rollout_index": i, "score": score,
                                           "actions": [{"name": n, "arguments": "{}", "observation": "ok"} for n in names]}
                                          for i, (score, names) in enumerate(rollouts)]}}


def _exploration(event_id, strategy, step, task_id, signal=None, kind=None):
    return {"event_id": event_id, "run_id": "r", "step": step, "strategy": strategy, "task_id": task_id,
            "signal_ids": [signal] if signal else [], "signal_kind": kind}


def _task(task_id, step, explorations, reference, signals=(), parent="multi_turn_base_1", verdict="validated"):
    return {"event_id": f"v-{task_id}", "run_id": "r", "task_id": task_id, "source": "synthesized", "step": step,
            "verdict": verdict, "stage": None, "reason": "", "exploration_ids": list(explorations),
            "signal_ids": list(signals), "seed_task_id": parent, "reference_solution": [list(reference)]}


def _trajectory(task_id, step, index, score):
    return {"event_id": f"t-{task_id}-{step}-{index}", "run_id": "r", "task_id": task_id, "step": step,
            "score": score, "actions": []}


def _run() -> Tally:
    """Step 1: a boundary signal on base_1 (its failing rollout called mv) and a rare signal on `touch`.
    Step 2: task A from the boundary signal (reference uses mv), task B from the fallback (uses cd), C
    rejected. Step 3: A drawn, scores unlike (trained); B drawn, scores alike (not trained); A's child D
    validated from a boundary signal on A. Step 4: base_1 drawn again, mean 0.75. base_2's boundary
    signal at step 1 was never explored; base_2 at step 3 scores 0.25."""
    tally = Tally(run_id="r")
    events = [
        ("SignalRaised", _signal("s1", "boundary", 1, "multi_turn_base_1", [1.0, 0.0],
                                 [(1.0, ["cd"]), (0.0, ["cd", "mv"])])),
        ("SignalRaised", _signal("s2", "rare", 1, None, pattern=("touch",))),
        ("SignalRaised", _signal("s3", "boundary", 1, "multi_turn_base_2", [0.5, 0.0], [(0.0, ["ls"])])),
        ("ExplorationRecorded", _exploration("e1", "signal-guided", 1, "multi_turn_base_1", "s1", "boundary")),
        ("ExplorationRecorded", _exploration("e2", "random-fallback", 1, "multi_turn_base_3")),
        ("ExplorationRecorded", _exploration("e3", "random-fallback", 1, "multi_turn_base_5")),
        ("TaskChecked", _task("A", 1, ["e1"], ["mv(source='a', destination='b')"], ["s1"])),
        ("TaskChecked", _task("B", 1, ["e2"], ["cd(folder='x')"], parent="multi_turn_base_3")),
        ("TaskChecked", _task("C", 1, ["e3"], ["touch(file_name='y')"], verdict="rejected")),
        *[("TrajectoryRecorded", _trajectory("A", 3, i, s)) for i, s in enumerate([1.0, 0.0, 0.0, 1.0])],
        *[("TrajectoryRecorded", _trajectory("B", 3, i, 1.0)) for i in range(4)],
        *[("TrajectoryRecorded", _trajectory("multi_turn_base_1", 4, i, s)) for i, s in enumerate([1.0, 0.5])],
        *[("TrajectoryRecorded", _trajectory("multi_turn_base_2", 3, i, 0.25)) for i in range(2)],
        ("SignalRaised", _signal("s4", "boundary", 3, "A", [1.0, 0.0], [(0.0, ["mv"])])),
        ("ExplorationRecorded", _exploration("e4", "signal-guided", 3, "A", "s4", "boundary")),
        ("TaskChecked", _task("D", 3, ["e4"], ["mv(source='c', destination='d')"], ["s4"], parent="A")),
    ]
    for name, event in events:
        tally.add(name, event)
    return tally


def test_the_tools_a_signal_involved_are_its_failing_rollouts_calls_or_its_pattern():
    s1, s2 = _signal("s1", "boundary", 1, "t", [1.0, 0.0], [(1.0, ["cd"]), (0.0, ["cd", "mv"])]), \
        _signal("s2", "rare", 1, None, pattern=("touch", "ls"))
    assert evidence_tools(s1) == {"cd", "mv"} and evidence_tools(s2) == {"touch", "ls"}
    assert call_names([["cd(folder='x')", "mv(a, b)"], ["not a call"]]) == {"cd", "mv"}


def test_origin_counts_validated_and_trained_tasks_by_strategy_and_signal_kind():
    counts = _run().mechanism.counts()
    assert counts["validated"] == {"signal-guided": 2, "random-fallback": 1}
    assert counts["trained"] == {"signal-guided": 1} and counts["trained_rollouts"] == {"signal-guided": 4}
    assert counts["validated_by_signal"] == {"boundary": 2} and counts["trained_by_signal"] == {"boundary": 1}


def test_targeting_checks_a_guided_task_against_its_signal_and_an_unguided_one_against_every_signal_before():
    targeting = _run().mechanism.targeting()
    assert targeting["signal-guided"] == {"tasks": 2, "targeted": 2, "share": 1.0}
    # B's reference calls cd: a tool of s1's failing rollout too, so the base rate counts it as a hit
    assert targeting["random-fallback"] == {"tasks": 1, "targeted": 1, "share": 1.0}


def test_repair_compares_explored_subjects_after_training_with_unexplored_ones_after_their_signal():
    repair = _run().mechanism.repair()
    assert repair["explored"]["measured"] == 1 and repair["explored"]["score_raised"] == 0.5
    assert repair["explored"]["score_later"] == 0.75 and repair["explored"]["change"] == 0.25
    assert repair["explored"]["unmeasured"] == 1  # s4's task D was never trained on
    assert repair["not_explored"] == {"measured": 1, "unmeasured": 0, "score_raised": 0.25, "score_later": 0.25,
                                      "change": 0.0}


def test_lineage_gives_each_task_its_parent_generation_signal_and_training_steps():
    rows = {r["task_id"]: r for r in _run().mechanism.lineage()}
    assert set(rows) == {"A", "B", "D"}
    assert (rows["A"]["parent"], rows["A"]["generation"], rows["A"]["trained"]) == ("multi_turn_base_1", 1, [3])
    assert (rows["D"]["parent"], rows["D"]["generation"], rows["D"]["subjects"]) == ("A", 2, ["A"])
    assert rows["B"]["strategy"] == "random-fallback" and rows["B"]["drawn"] == [3] and rows["B"]["trained"] == []


def test_the_terminal_names_where_a_steps_synthesized_tasks_came_from():
    tally = _run()
    tally.steps[3] = {"synthesized_trained": 4, "synthesized_tasks_trained": 1}
    assert tally.synthesized_line(3) == ("step 3: trained on 1 synthesized task (4 rollouts), from a boundary "
                                         "signal on multi_turn_base_1")
    summary = tally.mechanism.summary()
    assert origin_line(summary) == ("tasks: 3 validated (2 signal-guided (boundary 2), 1 random-fallback); trained "
                                    "on 1 (1 signal-guided (boundary 1)); on a weak spot's tools: random-fallback "
                                    "1 of 1, signal-guided 2 of 2")
    assert isinstance(Mechanism({}, {}, {}, {}).summary()["lineage"], list)
