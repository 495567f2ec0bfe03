"""Origin, targeting, repair and lineage on a small hand-made run whose answers are known."""
from coevolve.services.run.mechanism import Mechanism, call_names, evidence_tools
from coevolve.services.run.summary import origin_line, repair_line
from coevolve.services.run.tally import Tally
from tests.mechanism_run import events, signal

def _run() -> Tally:
    tally = Tally(run_id="r")
    for name, event in events():
        tally.add(name, event)
    return tally


def test_the_tools_a_signal_involved_are_its_failing_rollouts_calls_or_its_pattern():
    s1, s2 = signal("s1", "boundary", 1, "t", [1.0, 0.0], [(1.0, ["cd"]), (0.0, ["cd", "mv"])]), \
        signal("s2", "rare", 1, None, pattern=("touch", "ls"))
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


def _subjects(tally, step, scores):
    tally.add("EvaluationCompleted", {"event_id": f"eval-r-{step}-subjects", "run_id": "r", "step": step,
                                      "split": "subjects", "task_ids": list(scores), "scores": list(scores.values())})


def test_repair_compares_greedy_scores_of_explored_subjects_before_and_after_with_unexplored_ones():
    tally = _run()
    _subjects(tally, 0, {"multi_turn_base_1": 0.25, "multi_turn_base_2": 0.5, "A": 0.0})
    _subjects(tally, 5, {"multi_turn_base_1": 0.75, "multi_turn_base_2": 0.5, "A": 1.0})
    repair = tally.mechanism.repair()
    assert (repair["before_step"], repair["after_step"]) == (0, 5)
    # base_1: s1 made task A, trained at step 3; base_2: s3 never explored; A: s4 made D, never trained on
    assert repair["explored"] == {"measured": 1, "unmeasured": 0, "score_before": 0.25, "score_after": 0.75,
                                  "change": 0.5}
    assert repair["not_explored"] == {"measured": 2, "unmeasured": 0, "score_before": 0.25, "score_after": 0.75,
                                      "change": 0.5}
    assert repair_line({"repair": repair}) == ("repair (greedy, step 0 -> 5): explored subjects 0.25 -> 0.75 (n 1); "
                                               "not explored 0.25 -> 0.75 (n 2)")


def test_without_a_subjects_evaluation_at_step_0_repair_is_unmeasured_and_says_how_to_measure_it():
    tally = _run()
    _subjects(tally, 5, {"multi_turn_base_1": 0.75})
    repair = tally.mechanism.repair()
    assert repair["before_step"] is None and repair["explored"]["unmeasured"] == 1
    assert repair["not_explored"] == {"measured": 0, "unmeasured": 2, "score_before": None, "score_after": None,
                                      "change": None}
    assert repair_line({"repair": repair}) == ("repair: unmeasured (3 subjects; set learner.eval_at_start and "
                                               "learner.eval_subjects to score them before and after)")
    assert repair_line({"repair": Mechanism({}, {}, {}, {}).repair()}) == (
        "repair: no forgetting or boundary signal named a subject")


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


def test_a_subjects_evaluation_stays_out_of_the_held_out_evaluations():
    tally = _run()
    _subjects(tally, 5, {"multi_turn_base_1": 1.0, "multi_turn_base_2": 0.0})
    assert tally.evaluations == [] and tally.subject_scores == {("multi_turn_base_1", 5): 1.0,
                                                                ("multi_turn_base_2", 5): 0.0}
