"""Views of the running loop: what a person watching `coevolve run` looks at.

The held-out evaluation curve (EvaluationCompleted), the task pool and the learner's step time
(StepCompleted's pool and timing fields), explorations by strategy (ExplorationRecorded) and the
validator's verdicts by stage and reason (TaskChecked). Same conventions as `analyze.py`: one query over
FINAL tables per view, plain rows, and a note instead of rows when the run has no such events (the
simulator's runs have none of them).
"""
from __future__ import annotations

from coevolve.services.analytics.lineage import lineage, task_origin
from coevolve.services.analytics.view import View, query_rows
from coevolve.services.learner.loop.record import PHASES

VALIDATION_STAGES = ("well_formed", "executable", "novel", "dual_pass")  # the validator's order


def _stage_order(column: str) -> str:
    """SQL sort key of a stage name: the validator's order, unknown stages last."""
    position = f"indexOf({list(VALIDATION_STAGES)}, {column})"
    return f"if({position} = 0, 99, {position})"


def evaluation_curve(client, db: str, p: dict) -> View:
    """Held-out success rate and mean partial score per evaluated step: the paper's headline curve."""
    view = View("evaluation", "Evaluation score over steps (greedy, held-out)",
                ["run_id", "split", "step", "tasks", "success_rate", "mean_score"])
    view.rows = query_rows(client, f"""SELECT run_id, split, step, any(task_count), any(success_rate), any(mean_score)
        FROM {db}.evaluations FINAL WHERE run_id IN {{runs:Array(String)}}
        GROUP BY run_id, split, step ORDER BY run_id, split, step""", p)
    if not view.rows:
        view.note = "no EvaluationCompleted events archived for these runs"
    return view


def pool_per_step(client, db: str, p: dict) -> View:
    """The sampler's pool each step, the synthesized share, the synthesized rollouts the update trained on,
    and the groups that gave no gradient."""
    view = View("pool", "Task pool per step: size, synthesized share, synthesized rollouts trained on",
                ["run_id", "step", "pool_size", "synthesized", "synthesized_share", "synthesized_trained",
                 "zero_variance_groups", "resampled_groups", "tokens_trained"])
    view.rows = query_rows(client, f"""SELECT run_id, step, any(pool_size), any(pool_synthesized),
            any(pool_synthesized) / nullIf(any(pool_size), 0), any(synthesized_trained), any(zero_variance_groups),
            any(resampled_groups), any(tokens_trained)
        FROM {db}.steps FINAL WHERE run_id IN {{runs:Array(String)}} AND pool_size IS NOT NULL
        GROUP BY run_id, step ORDER BY run_id, step""", p)
    if not view.rows:
        view.note = "no StepCompleted events with pool fields archived for these runs (the simulator sends none)"
    return view


def step_time(client, db: str, p: dict) -> tuple[View, View]:
    """The learner's wall time per step split by phase, and per run the share of each phase; `blocked`
    is time spent waiting on the loop, `other` the rest of the step (never negative)."""
    per_step = View("step_time", "Learner step time per phase (seconds)",
                    ["run_id", "step", *PHASES, "other", "duration"])
    phases = [f"ifNull(any({phase}_seconds), 0)" for phase in PHASES]
    per_step.rows = query_rows(client, f"""SELECT run_id, step, {', '.join(phases)},
            greatest(any(duration_seconds) - ({' + '.join(phases)}), 0), any(duration_seconds)
        FROM {db}.steps FINAL WHERE run_id IN {{runs:Array(String)}} AND rollout_seconds IS NOT NULL
            AND duration_seconds IS NOT NULL
        GROUP BY run_id, step ORDER BY run_id, step""", p)
    share = View("time_share", "Share of the learner's wall time per phase; blocked share = sum blocked / sum duration",
                 ["run_id", "steps", "seconds", *(f"{phase}_share" for phase in PHASES)])
    shares = ", ".join(f"sum(ifNull({phase}_seconds, 0)) / nullIf(sum(duration_seconds), 0)" for phase in PHASES)
    share.rows = query_rows(client, f"""SELECT run_id, count(), sum(duration_seconds), {shares}
        FROM {db}.steps FINAL WHERE run_id IN {{runs:Array(String)}} AND rollout_seconds IS NOT NULL
            AND duration_seconds IS NOT NULL
        GROUP BY run_id ORDER BY run_id""", p)
    if not per_step.rows:
        per_step.note = share.note = "no StepCompleted events with timing fields archived for these runs"
    return per_step, share


def explorations_by_strategy(client, db: str, p: dict) -> View:
    """Explorations per step by strategy: signal-guided, random, random-calls, random-fallback, static."""
    view = View("explorations", "Explorations per step, by strategy", ["run_id", "step", "strategy", "explorations"])
    view.rows = query_rows(client, f"""SELECT run_id, step, toString(strategy), count() FROM {db}.explorations FINAL
        WHERE run_id IN {{runs:Array(String)}} GROUP BY run_id, step, strategy ORDER BY run_id, step, strategy""", p)
    if not view.rows:
        view.note = "no ExplorationRecorded events archived for these runs"
    return view


def verdicts(client, db: str, p: dict) -> tuple[View, View]:
    """Verdicts by the stage that decided them and the reason; and how many tasks reached and passed
    each validation stage (from every verdict's `stages`)."""
    by_reason = View("verdicts", "Verdicts by stage and reason", ["run_id", "verdict", "stage", "reason", "tasks"])
    by_reason.rows = query_rows(client, f"""
        SELECT run_id, toString(verdict) AS outcome,
               ifNull(toString(stage), if(outcome = 'validated', 'passed', 'not recorded')) AS decided_at, reason,
               count() AS n
        FROM {db}.tasks FINAL WHERE run_id IN {{runs:Array(String)}} AND source = 'synthesized'
        GROUP BY run_id, outcome, decided_at, reason
        ORDER BY run_id, outcome DESC, {_stage_order('decided_at')}, n DESC, reason""", p)
    funnel = View("stage_funnel", "Validation stages: tasks that reached and passed each",
                  ["run_id", "stage", "reached", "passed", "pass_rate"])
    funnel.rows = query_rows(client, f"""
        SELECT run_id, s.stage AS name, count(), countIf(s.passed), avg(s.passed)
        FROM {db}.tasks FINAL ARRAY JOIN stages AS s
        WHERE run_id IN {{runs:Array(String)}} AND source = 'synthesized'
        GROUP BY run_id, name ORDER BY run_id, {_stage_order('name')}, name""", p)
    if not by_reason.rows:
        by_reason.note = funnel.note = "no verdicts on synthesized tasks archived for these runs"
    elif not funnel.rows:
        funnel.note = "the archived verdicts carry no per-stage outcomes (TaskChecked before `stages`)"
    return by_reason, funnel


def loop_views(client, db: str, p: dict) -> list[View]:
    """Every view of the loop, in report order."""
    per_step, share = step_time(client, db, p)
    by_reason, funnel = verdicts(client, db, p)
    return [evaluation_curve(client, db, p), pool_per_step(client, db, p), per_step, share,
            explorations_by_strategy(client, db, p), by_reason, funnel, task_origin(client, db, p),
            lineage(client, db, p)]
