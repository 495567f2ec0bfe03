"""The training-dynamics views of the paper, computed in ClickHouse over the archive.

Each view is one query over FINAL tables (so redelivered events never count twice) and returns plain
rows; `plots.py` draws them and `coevolve analyze --json` prints them. A view whose events the archive
does not hold comes back empty with a note saying which events it needs.
"""
from __future__ import annotations

from coevolve.services.analytics.loop import loop_views
from coevolve.services.analytics.view import View, query_rows

STAGES = 3  # the paper reports validation pass rate over three stages of training


def runs(client, db: str) -> list[str]:
    """Every run that trained: one with trajectories, steps or evaluations archived."""
    return [r[0] for r in client.query(f"""SELECT DISTINCT run_id FROM (
        SELECT run_id FROM {db}.trajectories UNION ALL SELECT run_id FROM {db}.steps
        UNION ALL SELECT run_id FROM {db}.evaluations) ORDER BY run_id""").result_rows]


def signals_per_step(client, db: str, p: dict, replayed: list | None = None) -> View:
    """Signals raised per step, by kind: archived SignalRaised events, else an SQL replay of the run."""
    view = View("signals_per_step", "Signals raised per step, by type", ["run_id", "step", "kind", "signals"])
    view.rows = query_rows(client, f"""SELECT run_id, step, kind, count() FROM {db}.signals FINAL
        WHERE run_id IN {{runs:Array(String)}} GROUP BY run_id, step, kind ORDER BY run_id, step, kind""", p)
    if not view.rows and replayed:
        counts: dict[tuple, int] = {}
        for s in replayed:
            counts[(s.run_id, s.step, s.kind)] = counts.get((s.run_id, s.step, s.kind), 0) + 1
        view.rows = [[*k, v] for k, v in sorted(counts.items())]
        view.note = "no SignalRaised events archived; recomputed from the trajectories (SQL replay, default thresholds)"
    elif not view.rows:
        view.note = "no SignalRaised events archived for these runs"
    return view


def validation_pass_rate(client, db: str, p: dict) -> tuple[View, View]:
    """Share of synthesized tasks validated, per step and per stage (thirds of the run's steps)."""
    per_step = View("validation_per_step", "Validation pass rate per step", ["run_id", "step", "checked", "pass_rate"])
    per_step.rows = query_rows(client, f"""SELECT run_id, step, count(), avg(verdict = 'validated')
        FROM {db}.tasks FINAL WHERE run_id IN {{runs:Array(String)}} GROUP BY run_id, step ORDER BY run_id, step""", p)
    stages = View("validation_per_stage", "Validation pass rate per stage", ["run_id", "stage", "steps", "checked", "pass_rate"])
    stages.rows = query_rows(client, f"""
        WITH bounds AS (SELECT run_id, min(step) AS lo, max(step) AS hi FROM {db}.tasks FINAL GROUP BY run_id)
        SELECT t.run_id, least(intDiv((t.step - b.lo) * {STAGES}, b.hi - b.lo + 1), {STAGES - 1}) + 1 AS stage,
               concat(toString(min(t.step)), '-', toString(max(t.step))), count(), avg(t.verdict = 'validated')
        FROM {db}.tasks AS t FINAL JOIN bounds AS b ON t.run_id = b.run_id
        WHERE t.run_id IN {{runs:Array(String)}} GROUP BY t.run_id, stage ORDER BY t.run_id, stage""", p)
    if not per_step.rows:
        per_step.note = stages.note = "no TaskChecked events archived for these runs"
    return per_step, stages


def turn_distribution(client, db: str, p: dict) -> View:
    """Interaction turns per task: seed tasks (as trained) versus validated synthesized tasks."""
    view = View("turns", "Interaction turns of seed versus synthesized tasks", ["source", "turns", "tasks"])
    view.rows = query_rows(client, f"""
        SELECT source, turns, count() FROM (
            SELECT task_id, 'seed' AS source, toInt64(max(turn_count)) AS turns FROM {db}.trajectories FINAL
            WHERE run_id IN {{runs:Array(String)}} AND task_source = 'seed' GROUP BY task_id
            UNION ALL
            SELECT task_id, 'synthesized', toInt64(max(length(instruction_turns))) FROM {db}.tasks FINAL
            WHERE run_id IN {{runs:Array(String)}} AND source = 'synthesized' AND verdict = 'validated'
            GROUP BY task_id)
        GROUP BY source, turns ORDER BY source, turns""", p)
    if not any(r[0] == "synthesized" for r in view.rows):
        view.note = "no validated synthesized tasks archived; seed tasks only"
    return view


def reward_and_eval(client, db: str, p: dict) -> View:
    view = View("reward_eval", "Training reward and evaluation score per step",
                ["run_id", "step", "train_reward", "eval_success"])
    view.rows = query_rows(client, f"""SELECT run_id, step, any(train_reward), any(eval_success) FROM {db}.steps FINAL
        WHERE run_id IN {{runs:Array(String)}} GROUP BY run_id, step ORDER BY run_id, step""", p)
    if not view.rows:
        view.note = "no StepCompleted events archived for these runs"
    return view


def task_success(client, db: str, p: dict, tasks: int = 40) -> View:
    """Mean rollout score per (task, step), for the most-trained tasks."""
    view = View("task_success", "Per-task success over steps", ["run_id", "task_id", "step", "score"])
    view.rows = query_rows(client, f"""
        WITH top AS (SELECT task_id FROM {db}.trajectories FINAL WHERE run_id IN {{runs:Array(String)}}
                     GROUP BY task_id ORDER BY uniqExact(step) DESC, task_id LIMIT {int(tasks)})
        SELECT run_id, task_id, step, avg(score) FROM {db}.trajectories FINAL
        WHERE run_id IN {{runs:Array(String)}} AND task_id IN top
        GROUP BY run_id, task_id, step ORDER BY run_id, task_id, step""", p)
    return view


def forgetting_marks(client, db: str, p: dict, replayed: list | None = None) -> list[list]:
    rows = query_rows(client, f"""SELECT run_id, task_id, step FROM {db}.signals FINAL
        WHERE kind = 'forgetting' AND run_id IN {{runs:Array(String)}} ORDER BY run_id, task_id, step""", p)
    if not rows and replayed:
        rows = sorted([s.run_id, s.task_id, s.step] for s in replayed if s.kind == "forgetting")
    return rows


def rare_patterns(client, db: str, p: dict, top: int = 8) -> View:
    """The rarest tool calls over the run, and their share of all calls at each step (0 where unused)."""
    view = View("rare_patterns", "Rarest action patterns: share of calls per step",
                ["run_id", "pattern", "step", "count", "share"])
    view.rows = query_rows(client, f"""
        WITH per AS (SELECT run_id, step, name, count() AS c FROM {db}.actions FINAL
                     WHERE run_id IN {{runs:Array(String)}} GROUP BY run_id, step, name),
             rarest AS (SELECT name FROM per GROUP BY name ORDER BY sum(c), name LIMIT {int(top)}),
             totals AS (SELECT run_id, step, sum(c) AS n FROM per GROUP BY run_id, step)
        SELECT totals.run_id, rarest.name, totals.step, per.c, per.c / totals.n
        FROM totals CROSS JOIN rarest
        LEFT JOIN per ON per.run_id = totals.run_id AND per.step = totals.step AND per.name = rarest.name
        ORDER BY totals.run_id, rarest.name, totals.step""", p)
    if not view.rows:
        view.note = "no actions archived for these runs"
    return view


def analyze(client, db: str = "coevolve", run_ids: list[str] | None = None, replayed: list | None = None) -> dict:
    """Every view for the given runs (default: all archived runs)."""
    p = {"runs": run_ids or runs(client, db)}
    per_step, stages = validation_pass_rate(client, db, p)
    heat = task_success(client, db, p)
    return {
        "runs": p["runs"],
        "views": {v.name: v for v in (
            signals_per_step(client, db, p, replayed), per_step, stages, turn_distribution(client, db, p),
            reward_and_eval(client, db, p), heat, rare_patterns(client, db, p), *loop_views(client, db, p))},
        "forgetting": forgetting_marks(client, db, p, replayed),
    }
