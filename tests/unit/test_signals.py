"""The pure signal functions: each definition of issue 3, with its edge cases."""
from __future__ import annotations

import math

import pytest

from coevolve.streams.replay.engine_python import Replayer, replay_signals
from coevolve.streams.rules import (ACCEPTED, DUPLICATE, LATE, EvidenceLimits, InvalidEvent, Signal, Thresholds,
                                    close_groups, new_task_state, pattern_keys, record_rollout, rollout_of,
                                    signal_id)

TH = Thresholds()


def traj(task="t1", step=0, index=0, score=1.0, size=2, names=("ls",), run="r", eid=None):
    return {"event_id": eid or f"{run}/{task}/{step}/{index}", "run_id": run, "step": step,
            "task_id": task, "rollout_index": index, "group_size": size, "score": score,
            "actions": [{"name": n, "arguments": "{}", "observation": "o" * 300, "turn": 0} for n in names]}


def step(s, count, run="r"):
    return ("StepCompleted", {"event_id": f"step/{run}/{s}", "run_id": run, "step": s, "trajectory_count": count})


def T(**kw):
    return ("TrajectoryRecorded", traj(**kw))


def kinds(signals, kind):
    return sorted((s.step, s.subject) for s in signals if s.kind == kind)


def attempt(task, s, scores, size=None, names=("ls",)):
    size = size or len(scores)
    return [T(task=task, step=s, index=i, score=sc, size=size, names=names) for i, sc in enumerate(scores)]


# ---- attempts ----

def test_forgetting_after_success_within_window():
    events = attempt("a", 0, [1, 1]) + attempt("a", 1, [0, 0])
    sigs = replay_signals(events)
    assert kinds(sigs, "forgetting") == [(1, "a")]
    f = next(s for s in sigs if s.kind == "forgetting")
    assert f.evidence["scores"] == [0.0, 0.0] and f.evidence["attempt_score"] == 0.0
    assert f.evidence["previous_scores"] == [1.0]
    assert len(f.evidence["trajectories"]) == 2
    assert len(f.evidence["trajectories"][0]["actions"][0]["observation"]) == 200  # truncated


def test_no_forgetting_for_a_task_first_seen():
    assert kinds(replay_signals(attempt("a", 3, [0, 0])), "forgetting") == []


def test_no_forgetting_without_a_previous_success():
    events = attempt("a", 0, [0, 0.2]) + attempt("a", 1, [0, 0])
    assert kinds(replay_signals(events), "forgetting") == []


def test_window_limits_the_look_back_and_w1():
    # success at step 0, failures at 1..3: with W=1 only step 1 regresses; with W=3, steps 1..3.
    events = attempt("a", 0, [1, 1]) + attempt("a", 1, [0, 0]) + attempt("a", 2, [0, 0]) + attempt("a", 3, [0, 0])
    assert kinds(replay_signals(events, Thresholds(window=1)), "forgetting") == [(1, "a")]
    assert kinds(replay_signals(events, Thresholds(window=2)), "forgetting") == [(1, "a"), (2, "a")]
    assert kinds(replay_signals(events, Thresholds(window=3)), "forgetting") == [(1, "a"), (2, "a"), (3, "a")]


def test_ties_at_exactly_tau_count_as_success():
    # mean 0.5 == tau: the attempt succeeds, so no forgetting, and it counts as a previous success.
    events = attempt("a", 0, [0.25, 0.75]) + attempt("a", 1, [0.5, 0.5]) + attempt("a", 2, [0.0, 0.0])
    sigs = replay_signals(events)
    assert kinds(sigs, "forgetting") == [(2, "a")]
    # a rollout at exactly tau is a success: 0.5 and 0.4 make a boundary; 0.5 and 0.5 do not.
    assert (0, "a") in kinds(sigs, "boundary")
    assert (1, "a") not in kinds(sigs, "boundary")
    assert kinds(replay_signals(attempt("b", 0, [0.5, 0.4])), "boundary") == [(0, "b")]


def test_attempt_score_is_order_independent_mean():
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    fwd = replay_signals(attempt("a", 0, scores))
    rev = replay_signals(list(reversed(attempt("a", 0, scores))))
    assert fwd[0].evidence["attempt_score"] == rev[0].evidence["attempt_score"] == math.fsum(scores) / 7
    assert fwd[0].evidence["scores"] == scores  # by rollout index


def test_boundary_needs_both_sides():
    sigs = replay_signals(attempt("a", 0, [1, 0, 1]) + attempt("b", 0, [1, 1]) + attempt("c", 0, [0, 0]))
    assert kinds(sigs, "boundary") == [(0, "a")]


def test_duplicate_event_changes_nothing():
    state = new_task_state()
    r0 = rollout_of(traj(index=0, score=1.0))
    assert record_rollout(state, r0, TH) == (ACCEPTED, [])
    assert record_rollout(state, r0, TH) == (DUPLICATE, [])  # open group: not a second rollout
    out, sigs = record_rollout(state, rollout_of(traj(index=1, score=0.0)), TH)
    assert out == ACCEPTED and [s.kind for s in sigs] == ["boundary"]
    assert sigs[0].evidence["scores"] == [1.0, 0.0]
    assert record_rollout(state, r0, TH) == (DUPLICATE, [])  # closed group: still a duplicate


def test_rollout_for_a_closed_group_is_late():
    state = new_task_state()
    record_rollout(state, rollout_of(traj(index=0)), TH)
    record_rollout(state, rollout_of(traj(index=1)), TH)
    assert record_rollout(state, rollout_of(traj(index=1, eid="other")), TH) == (LATE, [])


def test_step_event_closes_a_short_group_with_what_it_has():
    # group of 4 with two rollouts; the step's completed event closes it before step 1 starts.
    events = [T(task="a", step=0, index=0, score=1, size=4), T(task="a", step=0, index=1, score=0, size=4),
              step(0, 2)] + attempt("a", 1, [0, 0, 0, 0])
    r = Replayer()
    for name, e in events:
        r.add_event(name, e)
    sigs = r.finish()
    b = [s for s in sigs if s.kind == "boundary"]
    assert [(s.step, s.evidence["scores"]) for s in b] == [(0, [1.0, 0.0])]
    # the short attempt (0.5) closed before step 1's, so step 1 sees it as a previous success
    assert kinds(sigs, "forgetting") == [(1, "a")]
    # and a rollout of step 0 that comes after step 1 started is late
    r.add_event(*T(task="a", step=0, index=3, score=1, size=4))
    assert r.outcomes[LATE] == 1


def test_step_record_order_in_the_log_does_not_matter():
    traj_events = [T(task="a", step=0, index=0, score=1, size=4), T(task="a", step=0, index=1, score=1, size=4)]
    traj_events += attempt("a", 1, [0, 0, 0, 0])
    first = replay_signals([step(0, 2)] + traj_events)
    last = replay_signals(traj_events + [step(0, 2)])
    assert {s.id for s in first} == {s.id for s in last}
    assert kinds(first, "forgetting") == [(1, "a")]


def test_end_of_input_closes_open_groups():
    sigs = replay_signals([T(task="a", step=0, index=0, score=1, size=8), T(task="a", step=0, index=1, score=0, size=8)])
    assert kinds(sigs, "boundary") == [(0, "a")]


def test_nan_score_is_invalid():
    with pytest.raises(InvalidEvent):
        rollout_of(traj(score=float("nan")))
    r = Replayer()
    r.add_event(*T(score=float("nan")))
    assert r.outcomes["invalid"] == 1 and r.finish() == []


def test_runs_are_independent():
    events = attempt("a", 0, [1, 1]) + [T(task="a", step=1, index=i, score=0, size=2, run="other") for i in range(2)]
    assert kinds(replay_signals(events), "forgetting") == []


# ---- rare ----

def test_pattern_keys_length_n_and_short_trajectories():
    assert pattern_keys(("a", "b", "a"), 1) == ["a", "b", "a"]
    assert pattern_keys(("a", "b", "a"), 2) == ["a\x1fb", "b\x1fa"]
    assert pattern_keys(("a",), 2) == []
    assert pattern_keys((), 1) == []


def _rare_log(counts: dict[str, int], per_traj=1, n_steps=1):
    """One trajectory per occurrence group: 'counts' gives each name's occurrences in step 0."""
    events, i = [], 0
    for name, c in counts.items():
        for _ in range(c):
            events.append(T(task=f"t{i % 3}", step=0, index=i, size=10**6, names=(name,) * per_traj, eid=f"e{i:05d}"))
            i += 1
    return events + [step(0, i)]


def test_rare_strictly_below_theta_percent():
    # N = 100: c=4 is rare at theta 5; c=5 is exactly 5% and is not.
    sigs = replay_signals(_rare_log({"common": 91, "four": 4, "five": 5}), limits=EvidenceLimits(rare_trajectories=5))
    rare = [s for s in sigs if s.kind == "rare"]
    assert [s.pattern for s in rare] == [("four",)]
    ev = rare[0].evidence
    assert ev["pattern_count"] == 4 and ev["pattern_total"] == 100
    assert ev["task_ids"] == sorted({f"t{i % 3}" for i in range(91, 95)})
    assert [t["event_id"] for t in ev["trajectories"]] == [f"e{i:05d}" for i in range(91, 95)]
    assert not rare[0].incomplete
    assert [s.pattern for s in replay_signals(_rare_log({"common": 91, "four": 4, "five": 5}),
                                              Thresholds(rare_threshold=5.01)) if s.kind == "rare"] == [("five",), ("four",)]


def test_rare_pattern_length_two_counts_every_occurrence():
    events = [T(task="a", step=0, index=0, size=99, names=("x", "y", "x", "y")),
              T(task="a", step=0, index=1, size=99, names=("z",)),  # shorter than n: no pattern
              step(0, 2)]
    sigs = replay_signals(events, Thresholds(rare_threshold=50, pattern_length=2))
    # N = 3: x>y twice (66%), y>x once (33% < 50%)
    rare = [s for s in sigs if s.kind == "rare"]
    assert [(s.pattern, s.evidence["pattern_count"], s.evidence["pattern_total"]) for s in rare] == [(("y", "x"), 1, 3)]
    assert rare[0].subject == "y > x"


def test_rare_evidence_is_capped_and_by_smallest_event_id():
    events = _rare_log({"common": 200, "seldom": 9})
    sigs = replay_signals(list(reversed(events[:-1])) + [events[-1]], limits=EvidenceLimits(rare_trajectories=3))
    rare = next(s for s in sigs if s.kind == "rare")
    assert [t["event_id"] for t in rare.evidence["trajectories"]] == ["e00200", "e00201", "e00202"]


def test_rare_duplicates_do_not_count_twice():
    events = _rare_log({"common": 96, "seldom": 4})
    dup = [e for e in events if e[0] == "TrajectoryRecorded" and e[1]["actions"][0]["name"] == "seldom"]
    sigs = replay_signals(events[:-1] + dup + dup + [events[-1]])
    assert next(s for s in sigs if s.kind == "rare").evidence["pattern_count"] == 4


def test_step_without_completed_record_is_closed_at_end_incomplete():
    events = _rare_log({"common": 96, "seldom": 4})[:-1]
    rare = [s for s in replay_signals(events) if s.kind == "rare"]
    assert [s.pattern for s in rare] == [("seldom",)] and rare[0].incomplete
    # a step whose count is not reached is incomplete too
    rare = [s for s in replay_signals(events + [step(0, 101)]) if s.kind == "rare"]
    assert rare[0].incomplete


# ---- ids and forms ----

def test_signal_id_is_deterministic_and_depends_on_thresholds():
    a = signal_id("rare", "r", 3, "mv", Thresholds())
    assert a == signal_id("rare", "r", 3, "mv", Thresholds(0.5, 5, 5, 1))
    assert a != signal_id("rare", "r", 3, "mv", Thresholds(rare_threshold=6))
    assert a != signal_id("rare", "r", 4, "mv", Thresholds())
    assert len(a) == 32


def test_json_and_record_round_trip():
    sigs = replay_signals(attempt("a", 0, [1, 1]) + attempt("a", 1, [0, 0.2]) + _rare_log({"c": 96, "s": 4}))
    for s in sigs:
        assert Signal.from_json(s.to_json()).to_json() == s.to_json()
        assert Signal.from_record(s.to_record(0)).id == s.id
    from coevolve.schemas import default_registry
    reg = default_registry()
    for s in sigs:
        name, rec = reg.decode(reg.encode("SignalRaised", s.to_record(0)))
        assert rec["event_id"] == s.id


def test_thresholds_validate():
    for bad in (dict(window=0), dict(pattern_length=0), dict(rare_threshold=101), dict(success_threshold=float("nan"))):
        with pytest.raises(ValueError):
            Thresholds(**bad)


def test_offer_candidate_sends_only_what_can_be_among_the_smallest():
    from coevolve.streams.rules import offer_candidate
    best: dict = {}
    assert offer_candidate(best, "e5", ["a", "a"], 2) and offer_candidate(best, "e7", ["a"], 2)
    assert best["a"] == ["e5", "e7"]  # a repeated key offers its trajectory once
    assert not offer_candidate(best, "e9", ["a"], 2)  # two smaller ids for its only pattern
    assert offer_candidate(best, "e9", ["a", "b"], 2)  # first for pattern b
    assert offer_candidate(best, "e1", ["a"], 2) and best["a"] == ["e1", "e5"]
