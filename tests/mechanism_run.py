"""A small hand-made run whose origin, targeting, repair and lineage are known (tests/unit/test_run_mechanism.py
says the answers): each event complete, so the archive can store it too."""
from __future__ import annotations

from tests.events import sample_events

TH = {"success_threshold": 0.5, "window": 5, "rare_threshold": 10.0, "pattern_length": 1}


def signal(event_id, kind, step, task_id, scores=(), rollouts=(), pattern=()):
    return {"event_id": event_id, "kind": kind, "run_id": "r", "step": step, "task_id": task_id,
            "subject": task_id or " > ".join(pattern), "pattern": list(pattern), "thresholds": TH,
            "evidence": {"scores": list(scores), "attempt_score": sum(scores) / len(scores) if scores else None,
                         "previous_scores": [], "pattern_count": 0, "pattern_total": 0,
                         "task_ids": [task_id] if task_id else [],
                         "trajectories": [{"event_id": f"{event_id}-{i}", "task_id": task_id, "rollout_index": i,
                                           "score": score,
                                           "actions": [{"name": n, "arguments": "{}", "observation": "ok"} for n in names]}
                                          for i, (score, names) in enumerate(rollouts)]}}


def exploration(event_id, strategy, step, task_id, signal=None, kind=None):
    return {"event_id": event_id, "run_id": "r", "step": step, "strategy": strategy, "task_id": task_id,
            "signal_ids": [signal] if signal else [], "signal_kind": kind}


def task(task_id, step, explorations, reference, signals=(), parent="multi_turn_base_1", verdict="validated"):
    return {"event_id": f"v-{task_id}", "run_id": "r", "task_id": task_id, "source": "synthesized", "step": step,
            "verdict": verdict, "stage": None, "reason": "", "exploration_ids": list(explorations),
            "signal_ids": list(signals), "seed_task_id": parent, "reference_solution": [list(reference)]}


def trajectory(task_id, step, index, score):
    return {"event_id": f"t-{task_id}-{step}-{index}", "run_id": "r", "task_id": task_id, "step": step,
            "rollout_index": index, "score": score, "actions": []}


def events() -> list[tuple[str, dict]]:
    """Step 1: a boundary signal on base_1 (its failing rollout called mv) and a rare signal on `touch`.
    Step 2: task A from the boundary signal (reference uses mv), task B from the fallback (uses cd), C
    rejected. Step 3: A drawn, scores unlike (trained); B drawn, scores alike (not trained); A's child D
    validated from a boundary signal on A. Step 4: base_1 drawn again, mean 0.75. base_2's boundary
    signal at step 1 was never explored; base_2 at step 3 scores 0.25."""
    base = sample_events()
    made = [
        ("SignalRaised", signal("s1", "boundary", 1, "multi_turn_base_1", [1.0, 0.0],
                                 [(1.0, ["cd"]), (0.0, ["cd", "mv"])])),
        ("SignalRaised", signal("s2", "rare", 1, None, pattern=("touch",))),
        ("SignalRaised", signal("s3", "boundary", 1, "multi_turn_base_2", [0.5, 0.0], [(0.0, ["ls"])])),
        ("ExplorationRecorded", exploration("e1", "signal-guided", 1, "multi_turn_base_1", "s1", "boundary")),
        ("ExplorationRecorded", exploration("e2", "random-fallback", 1, "multi_turn_base_3")),
        ("ExplorationRecorded", exploration("e3", "random-fallback", 1, "multi_turn_base_5")),
        ("TaskChecked", task("A", 1, ["e1"], ["mv(source='a', destination='b')"], ["s1"])),
        ("TaskChecked", task("B", 1, ["e2"], ["cd(folder='x')"], parent="multi_turn_base_3")),
        ("TaskChecked", task("C", 1, ["e3"], ["touch(file_name='y')"], verdict="rejected")),
        *[("TrajectoryRecorded", trajectory("A", 3, i, s)) for i, s in enumerate([1.0, 0.0, 0.0, 1.0])],
        *[("TrajectoryRecorded", trajectory("B", 3, i, 1.0)) for i in range(4)],
        *[("TrajectoryRecorded", trajectory("multi_turn_base_1", 4, i, s)) for i, s in enumerate([1.0, 0.5])],
        *[("TrajectoryRecorded", trajectory("multi_turn_base_2", 3, i, 0.25)) for i in range(2)],
        ("SignalRaised", signal("s4", "boundary", 3, "A", [1.0, 0.0], [(0.0, ["mv"])])),
        ("ExplorationRecorded", exploration("e4", "signal-guided", 3, "A", "s4", "boundary")),
        ("TaskChecked", task("D", 3, ["e4"], ["mv(source='c', destination='d')"], ["s4"], parent="A")),
    ]
    return [(name, {**base[name], **event}) for name, event in made]
