"""The loop's views in the real engine (chDB) over a run whose figures are known by hand; every event
inserted twice (a redelivered batch) still counts once."""
from __future__ import annotations

import pytest

from coevolve.schemas import default_registry
from coevolve.services.analytics.analyze import analyze, runs
from coevolve.services.analytics.loop import loop_views
from coevolve.services.archive.rows import COLUMNS, rows_for
from coevolve.services.clickhouse.client import connect
from coevolve.services.simulate import SimulationConfig, Simulator
from tests import loop_events
from tests.loop_events import loop_run

pytestmark = pytest.mark.integration
DB = "loopviews"  # chdb://memory is one engine per process: a database of its own


def store(client, db: str, events) -> None:
    registry = default_registry()  # as the archiver sees them: decoded, every field at least its default
    tables: dict[str, list] = {}
    for name, event in events:
        for table, rows in rows_for(*registry.decode(registry.encode(name, event)), 0, 0).items():
            tables.setdefault(table, []).extend(rows)
    for table, rows in tables.items():
        client.insert(f"{db}.{table}", rows, column_names=COLUMNS[table])


@pytest.fixture(scope="module")
def archive():
    client = connect("chdb://memory", database=DB)
    events = [(name, event) for _, name, event in loop_run()]
    sim = [(name, event) for _, _, name, event in Simulator(SimulationConfig(steps=3, tasks=8, batch_tasks=4)).events()]
    store(client, DB, events + sim)
    store(client, DB, events)  # redelivered
    yield client
    client.close()


def _views(client, run: str) -> dict:
    return {v.name: v for v in loop_views(client, DB, {"runs": [run]})}


def test_the_loop_run_gives_its_known_figures(archive):
    views = _views(archive, "loop-run")
    assert [(r[2], r[4], r[5]) for r in views["evaluation"].rows] == \
        [(step, rate, mean) for step, (rate, mean) in sorted(loop_events.EVALUATED.items())]
    pool = views["pool"].rows
    assert [(r[1], r[2], r[3]) for r in pool] == [(s, 100 + 2 * (s - 1), 2 * (s - 1)) for s in range(1, 7)]
    assert pool[-1][4] == pytest.approx(10 / 110)
    assert [r[5] for r in pool] == [4 * (s - 1) for s in range(1, 7)]  # synthesized rollouts trained on
    (share,) = views["time_share"].rows
    assert share[:3] == ["loop-run", loop_events.STEPS, pytest.approx(60.0)]
    assert share[-1] == pytest.approx(loop_events.BLOCKED_SHARE)
    assert share[3] == pytest.approx(0.5)  # rollout: 5 s of every 10 s step
    other = [r[-2] for r in views["step_time"].rows]
    assert other == pytest.approx([0.5, 0.6, 0.5, 0.6, 0.5, 0.6])  # 10 s minus the phases, blocked included
    strategies: dict[str, int] = {}
    for _run, _step, strategy, n in views["explorations"].rows:
        strategies[strategy] = strategies.get(strategy, 0) + n
    assert strategies == loop_events.EXPLORATIONS
    verdicts = {(r[1], r[2]): r[4] for r in views["verdicts"].rows}
    assert verdicts == loop_events.VERDICTS
    assert [r[1] for r in views["verdicts"].rows] == ["validated", "rejected", "rejected"]
    funnel = {r[1]: (r[2], r[3]) for r in views["stage_funnel"].rows}
    assert list(funnel) == list(loop_events.STAGES) and funnel == loop_events.FUNNEL


def test_a_simulated_run_has_notes_instead_of_loop_rows(archive):
    views = _views(archive, "sim-run")
    for name in ("evaluation", "pool", "step_time", "time_share", "explorations", "stage_funnel"):
        assert not views[name].rows and views[name].note, name
    assert "no EvaluationCompleted events" in views["evaluation"].note
    # the simulator's verdicts predate `stage`: still counted, their stage marked as not recorded
    assert {r[2] for r in views["verdicts"].rows} <= {"passed", "not recorded"} and views["verdicts"].rows
    assert "carry no per-stage outcomes" in views["stage_funnel"].note


def test_runs_include_those_with_only_steps_or_evaluations(archive):
    assert runs(archive, DB) == ["loop-run", "sim-run"]
    result = analyze(archive, DB, ["loop-run"])
    assert result["views"]["validation_per_step"].rows  # the existing pass rate reads the new verdicts too
    assert [r[3] for r in result["views"]["validation_per_step"].rows] == pytest.approx([1 / 3] * 6)
