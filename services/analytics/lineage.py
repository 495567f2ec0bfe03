"""Where the loop's tasks came from, in ClickHouse: origin by strategy and the lineage of every task.

The same definitions as `services/run/mechanism.py` (summary.json), over the archive: a validated task's
strategy and signal kind are its explorations'; it was *trained on* at a step whose rollouts of it
scored unlike. `lineage` is the one query from a signal to what came of it: the signal's kind and
subject, the explorations it led to, the task proposed and its verdict, the task's parent, the steps
that drew and trained on it, and the subject's mean score at its draws after the task was validated.
"""
from __future__ import annotations

from coevolve.services.analytics.view import View, query_rows


def _origin(db: str) -> str:
    """One row per synthesized task with a verdict: its strategy, signal kind and signals' subjects."""
    return f"""SELECT t.run_id AS run_id, t.task_id AS task_id, any(t.verdict) AS verdict, any(t.step) AS step,
            any(ifNull(t.seed_task_id, '')) AS parent,
            if(countIf(e.event_id != '') = 0, 'unknown', anyIf(toString(e.strategy), e.event_id != '')) AS strategy,
            anyIf(ifNull(e.signal_kind, ''), e.event_id != '') AS kind, any(t.signal_ids) AS signal_ids,
            groupUniqArray(e.event_id) AS explorations
        FROM {db}.tasks AS t FINAL LEFT ARRAY JOIN t.exploration_ids AS exploration_id
        LEFT JOIN (SELECT event_id, strategy, signal_kind FROM {db}.explorations FINAL) AS e
            ON e.event_id = exploration_id
        WHERE t.run_id IN {{runs:Array(String)}} AND t.source = 'synthesized'
        GROUP BY t.run_id, t.task_id"""


def _draws(db: str) -> str:
    """One row per (task, step) drawn: its mean score, and whether its rollouts scored unlike."""
    return f"""SELECT task_id, step, avg(score) AS mean_score, max(score) > min(score) AS trained
        FROM {db}.trajectories FINAL WHERE run_id IN {{runs:Array(String)}} GROUP BY task_id, step"""


def task_origin(client, db: str, p: dict) -> View:
    """Validated and trained-on tasks by strategy and signal kind."""
    view = View("task_origin", "Validated and trained-on tasks, by strategy and signal kind",
                ["run_id", "strategy", "signal_kind", "validated", "trained_on"])
    view.rows = query_rows(client, f"""WITH origin AS ({_origin(db)}), draws AS ({_draws(db)})
        SELECT o.run_id, o.strategy, o.kind, count(), countIf(o.task_id IN (SELECT task_id FROM draws WHERE trained))
        FROM origin AS o WHERE o.verdict = 'validated'
        GROUP BY o.run_id, o.strategy, o.kind ORDER BY o.run_id, o.strategy, o.kind""", p)
    if not view.rows:
        view.note = "no validated synthesized task archived for these runs"
    return view


def lineage(client, db: str, p: dict) -> View:
    """One row per synthesized task: from its signal to the steps that trained on it and its subject after."""
    view = View("lineage", "Lineage: signal, explorations, proposed task and verdict, training, subject after",
                ["run_id", "task_id", "verdict", "parent", "strategy", "signal_kind", "subjects", "explorations",
                 "validated_at", "drawn_at", "trained_at", "subject_score_raised", "subject_score_after"])
    view.rows = query_rows(client, f"""WITH origin AS ({_origin(db)}), draws AS ({_draws(db)}),
            subjects AS (
                SELECT o.task_id AS task_id, groupUniqArray(s.subject) AS names,
                       avg(s.attempt_score) AS raised, any(ifNull(s.task_id, '')) AS subject_task
                FROM origin AS o ARRAY JOIN o.signal_ids AS signal_id
                JOIN (SELECT event_id, subject, attempt_score, task_id FROM {db}.signals FINAL) AS s
                    ON s.event_id = signal_id
                GROUP BY o.task_id)
        SELECT o.run_id, o.task_id, o.verdict, o.parent, o.strategy, o.kind, s.names, length(o.explorations), o.step,
               arraySort(arrayMap(x -> x.1, arrayFilter(x -> x.2 = o.task_id, d.all))),
               arraySort(arrayMap(x -> x.1, arrayFilter(x -> x.2 = o.task_id AND x.3, d.all))),
               s.raised,
               if(empty(arrayFilter(x -> x.2 = s.subject_task AND x.1 > o.step, d.all) AS later), NULL,
                  arrayAvg(arrayMap(x -> x.4, later)))
        FROM origin AS o
        LEFT JOIN subjects AS s ON s.task_id = o.task_id
        CROSS JOIN (SELECT groupArray((step, task_id, trained, mean_score)) AS all FROM draws) AS d
        ORDER BY o.run_id, o.step, o.task_id""", p)
    if not view.rows:
        view.note = "no synthesized task archived for these runs"
    return view
