"""`coevolve replay --against-run`: over a hand-made archived run whose lineage is known, a stricter tau
drops one live signal, adds one, and names exactly the explorations, tasks and trained-on steps that
descend from the dropped signal (a second-generation task included)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from coevolve.schemas.codec import default_registry
from coevolve.services.archive.rows import COLUMNS, rows_for
from coevolve.services.cli import app
from coevolve.services.clickhouse.client import connect
from coevolve.streams.replay.against import against_run, against_text
from tests.cli_output import plain
from tests.events import sample_events

pytestmark = pytest.mark.integration
DB = "coevolve"
LIVE = {"success_threshold": 0.5, "window": 4, "rare_threshold": 5.0, "pattern_length": 1}


def _run() -> list[tuple[str, dict]]:
    """Step 1: A (0.6, 0.2) and B (0.9, 0.1) raise boundary signals sA and sB at tau 0.5. T1 comes from
    sA's exploration, T2 from sB's, T3 from both, R from sA's (rejected), F from a fallback exploration.
    Step 2: T1 (1, 0) and T3 (0.8, 0.3) train and raise boundary signals; T2 (1, 1) does not; sT1's
    exploration gives T4. Step 3: C (0.75, 0.65) raises nothing at tau 0.5."""
    base = sample_events()
    groups = {1: {"A": (0.6, 0.2), "B": (0.9, 0.1)},
              2: {"T1": (1.0, 0.0), "T2": (1.0, 1.0), "T3": (0.8, 0.3)}, 3: {"C": (0.75, 0.65)}}
    made = []
    for step, tasks in groups.items():
        for task, scores in tasks.items():
            made += [("TrajectoryRecorded", {"event_id": f"t-{task}-{step}-{i}", "run_id": "r", "step": step,
                                             "task_id": task, "rollout_index": i, "group_size": 2, "score": s})
                     for i, s in enumerate(scores)]
        made.append(("StepCompleted", {"run_id": "r", "step": step, "trajectory_count": 2 * len(tasks),
                                       "event_id": f"step-{step}"}))
    for sid, step, task in (("sA", 1, "A"), ("sB", 1, "B"), ("sT1", 2, "T1"), ("sT3", 2, "T3")):
        made.append(("SignalRaised", {"event_id": sid, "kind": "boundary", "run_id": "r", "step": step,
                                      "subject": task, "task_id": task, "pattern": [], "thresholds": LIVE}))
    for eid, step, signals in (("eA", 1, ["sA"]), ("eB", 1, ["sB"]), ("eT1", 2, ["sT1"]), ("eF", 1, [])):
        made.append(("ExplorationRecorded", {"event_id": eid, "run_id": "r", "step": step, "signal_ids": signals,
                                             "signal_id": signals[0] if signals else None,
                                             "strategy": "signal-guided" if signals else "random-fallback"}))
    for task, step, explorations, verdict in (("T1", 1, ["eA"], "validated"), ("T2", 1, ["eB"], "validated"),
                                              ("T3", 1, ["eA", "eB"], "validated"), ("R", 1, ["eA"], "rejected"),
                                              ("F", 1, ["eF"], "validated"), ("T4", 2, ["eT1"], "validated")):
        made.append(("TaskChecked", {"event_id": f"v-{task}", "run_id": "r", "task_id": task, "step": step,
                                     "source": "synthesized", "verdict": verdict, "exploration_ids": explorations}))
    return [(name, {**base[name], **event}) for name, event in made]


def _store(client, db: str) -> None:
    registry = default_registry()
    tables: dict[str, list] = {}
    for offset, (name, event) in enumerate(_run()):  # one partition, in log order
        for table, rows in rows_for(*registry.decode(registry.encode(name, event)), 0, offset).items():
            tables.setdefault(table, []).extend(rows)
    for table, rows in tables.items():
        client.insert(f"{db}.{table}", rows, column_names=COLUMNS[table])


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = f"chdb://{tmp_path_factory.mktemp('archive')}/ch"
    client = connect(url)
    try:
        _store(client, DB)
    finally:
        client.close()
    return url


@pytest.fixture
def archive(url):
    client = connect(url, create=False)
    yield client
    client.close()


def test_the_live_thresholds_change_nothing(archive):
    c = against_run(archive, DB, "r", lambda run_own: run_own)
    assert c.signals["boundary"] == {"live": 4, "kept": 4, "dropped": 0, "added": 0}
    assert c.tasks == [] and c.explorations == (0, 4) and c.trained_on == (0, 2)


def test_a_stricter_tau_names_the_tasks_that_descend_from_the_dropped_signal(archive):
    c = against_run(archive, DB, "r", lambda run_own: replace(run_own, success_threshold=0.7))
    assert c.live_thresholds == [LIVE]
    assert (c.dropped, c.added) == ([("boundary", 1, "A")], [("boundary", 3, "C")])
    assert c.signals["boundary"] == {"live": 4, "kept": 3, "dropped": 1, "added": 1}
    assert c.lost_by_descent == 1  # sT1: its subject T1 would not have been in the pool
    assert {t.task_id: (t.verdict, t.trained_at, t.cause) for t in c.tasks} == {
        "T1": ("validated", [2], "boundary at step 1 on A"),
        "R": ("rejected", [], "boundary at step 1 on A"),
        "T4": ("validated", [], "descends from T1")}
    assert (c.explorations, c.validated, c.trained_on, c.trained_steps) == ((2, 4), (2, 5), (1, 2), 1)
    text = against_text(c)
    assert "under tau=0.7 W=4 theta=5 n=1: 1 of 2 trained-on tasks, 2 of 5 validated tasks and 2 of 4 " \
           "explorations would not exist" in text
    assert "  - boundary step=1 A" in text and "  + boundary step=3 C" in text


def test_an_unknown_run_is_refused_with_the_runs_there_are(archive):
    with pytest.raises(ValueError, match="run 'nope' has no trajectories in the archive; archived runs: r"):
        against_run(archive, DB, "nope", lambda run_own: run_own)


def test_the_command_takes_the_runs_own_thresholds_and_writes_its_report(url, tmp_path):
    result = CliRunner().invoke(app, ["replay", "--clickhouse", url, "--against-run", "r", "--success-threshold", "0.7",
                                      "--report", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    out = plain(result.output)
    assert "run r (live: tau=0.5 W=4 theta=5 n=1) against tau=0.7 W=4 theta=5 n=1" in out
    assert "boundary 4 3 1 1" in out
    md = (tmp_path / "report" / "against-r.md").read_text()
    assert md.startswith("# under tau=0.7 W=4 theta=5 n=1: 1 of 2 trained-on tasks")
    assert json.loads((tmp_path / "report" / "against-r.json").read_text())["trained_on"] == [1, 2]
