"""The workload simulator: deterministic, realistic, and honest about its configuration."""
from collections import Counter

import pytest

from coevolve.schemas import default_registry
from coevolve.schemas.container import read_log
from coevolve.services.runtime.config import ConfigError
from coevolve.services.simulate import SimulationConfig, Simulator, write_file


def _events(**kw):
    return list(Simulator(SimulationConfig(**kw)).events())


def test_same_seed_same_stream_other_seed_other_stream():
    a, b = _events(steps=3, seed=1), _events(steps=3, seed=1)
    strip = lambda evs: [(t, k, n, {**e, "produced_at": 0}) for t, k, n, e in evs]  # noqa: E731
    assert strip(a) == strip(b)
    assert strip(a) != strip(_events(steps=3, seed=2))


def test_each_step_publishes_its_groups_then_a_completed_step_with_the_count():
    cfg = SimulationConfig(steps=4, batch_tasks=5, group_size=3, synthesized_per_step=0)
    events = list(Simulator(cfg).events())
    steps = [e for _, _, n, e in events if n == "StepCompleted"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    for s in steps:
        trajs = [e for _, _, n, e in events if n == "TrajectoryRecorded" and e["step"] == s["step"]]
        assert s["trajectory_count"] == len(trajs) == 15
        groups = Counter(e["task_id"] for e in trajs)
        assert set(groups.values()) == {3}
    ids = [e["event_id"] for _, _, _, e in events]
    assert len(ids) == len(set(ids))


def test_every_event_fits_its_schema():
    registry = default_registry()
    for _topic, _key, name, event in _events(steps=2):
        assert registry.decode(registry.encode(name, event))[0] == name


def test_skills_are_learned_over_the_run_and_some_tools_are_rare():
    events = _events(tasks=60, batch_tasks=60, steps=30, group_size=4, seed=3, synthesized_per_step=0)
    trajs = [e for _, _, n, e in events if n == "TrajectoryRecorded"]
    early = [e["score"] for e in trajs if e["step"] < 5]
    late = [e["score"] for e in trajs if e["step"] >= 25]
    assert sum(late) / len(late) > sum(early) / len(early) + 0.2
    counts = Counter(a["name"] for e in trajs for a in e["actions"])
    total = sum(counts.values())
    assert any(c / total < 0.005 for c in counts.values())  # a long tail of rare tools


def test_forgetting_happens_when_asked_for():
    events = _events(tasks=20, batch_tasks=20, steps=30, forget_probability=0.2, seed=5, synthesized_per_step=0)
    by_task: dict[str, list[tuple[int, float]]] = {}
    for _, _, n, e in events:
        if n == "TrajectoryRecorded" and e["rollout_index"] == 0:
            by_task.setdefault(e["task_id"], []).append((e["step"], e["score"]))
    drops = sum(1 for series in by_task.values()
                for (_, a), (_, b) in zip(series, series[1:]) if a == 1.0 and b < 0.5)
    assert drops > 0


def test_synthesized_tasks_get_verdicts_and_validated_ones_join_training():
    events = _events(steps=6, synthesized_per_step=4, validation_pass_rate=0.5, seed=7)
    verdicts = [e for _, _, n, e in events if n == "TaskChecked"]
    assert len(verdicts) == 24 and {v["verdict"] for v in verdicts} == {"validated", "rejected"}
    validated = {v["task_id"] for v in verdicts if v["verdict"] == "validated"}
    trained = {e["task_id"] for _, _, n, e in events if n == "TrajectoryRecorded" and e["task_source"] == "synthesized"}
    assert trained and trained <= validated


@pytest.mark.parametrize("kw,match", [({"tasks": 0}, "tasks must be at least 1"),
                                      ({"tasks": 5, "batch_tasks": 9}, "exceeds tasks"),
                                      ({"forget_probability": 2.0}, "probabilities")])
def test_invalid_configurations_fail_at_start(kw, match):
    with pytest.raises(ConfigError, match=match):
        SimulationConfig(**kw)


def test_output_file_holds_the_same_stream(tmp_path):
    cfg = SimulationConfig(steps=3, seed=4)
    counts, files = write_file(cfg, tmp_path / "run.avro")
    assert {f.name for f in files} == {"run.avro", "run.StepCompleted.avro", "run.TaskChecked.avro"}
    read = [(n, e["event_id"]) for n, e in read_log(files)]
    assert Counter(n for n, _ in read) == Counter(counts)
    streamed = [(n, e["event_id"]) for _, _, n, e in Simulator(cfg).events()]
    assert sorted(read) == sorted(streamed)


def test_long_runs_do_not_overflow_the_skill_curve():
    events = _events(tasks=2, batch_tasks=1, group_size=1, steps=2000, synthesized_per_step=0)
    scores = [e["score"] for _, _, n, e in events if n == "TrajectoryRecorded"]
    assert len(scores) == 2000 and all(0.0 <= s <= 1.0 for s in scores)
