"""The SQL engine's text: the three signals as ClickHouse SQL stages, over the archive or over Avro
log files that ClickHouse reads directly (`engine_sql` runs them).

The rules are those of streams/rules.py (the reference), restated as set operations over log
positions (`pos`: partition and offset in the archive, file and row for files):
- the first occurrence of an event_id counts (an event_id is taken to name one event: the reference
  tells duplicates apart per group, so two different events sharing an id could differ); invalid
  trajectories (non-finite score, group_size < 1) count for nothing;
- a completed-step record (run, s) takes effect at the first trajectory of the run with a step > s (its
  trigger), else at the end of the input;
- a group (run, task, step) opens at its first rollout p1 and closes at its group_size-th rollout or at
  the first trigger after p1, whichever comes first; rollouts after that are late;
- groups close in (close position, step) order, and forgetting looks at the W highest-step attempts of
  the task with a lower step that closed before this one;
- a step's rare counts cover its accepted rollouts up to the larger of its trajectory_count and the
  number accepted before its trigger.
SQL picks every attempt within 1e-9 of tau as a forgetting candidate; the final comparison of the
means uses math.fsum, as the reference does, because sumKahan is not exactly rounded (a mean of
exactly tau would otherwise flip). Each stage is materialized as a temporary table: inlined CTEs with
joins ran an order of magnitude slower. Group, step and pattern keys are 64-bit hashes of their columns.
The heavy passes over every trajectory are few: one aggregation per group gives the attempt when no
rollout of the group is late (the common case), and rare counts read the first occurrences minus a
short list of excluded positions (late, or past their step's cut); only groups with late rollouts and
steps with more accepted rollouts than their trajectory_count are recomputed from their positions.

Known difference: the reference forgets a task's closed attempts beyond max(W, 16) and then calls a
first rollout at or below the forgotten steps late; here the look-back is W + 16 attempts and nothing
is called late for it. Only logs whose attempts close more than 16 steps out of order can differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coevolve.services.clickhouse.sql import literal, quote_path
from coevolve.streams.replay.sources import split_inputs
from coevolve.streams.rules import KEEP_CLOSED, SEP, Thresholds

INF = 2**64 - 1


@dataclass(frozen=True)
class Source:
    """Where the SQL replay reads: `trajectories` (every occurrence, with `pos`), `steps`, and whether
    event ids are already unique (the archive keeps each id's first occurrence)."""

    trajectories: str
    steps: str
    unique: bool
    evidence: tuple[str, object]


def archive_source(db: str, run_id: str | None = None) -> Source:
    """The archive (or one run of it: every rule reads within a run); pos = (partition + 1, offset) of
    the event's first occurrence in the log."""
    where = f" WHERE run_id = {literal(run_id)}" if run_id is not None else ""
    traj = f"""SELECT toUInt64(bitShiftLeft(toUInt64(log_partition + 1), 44) + toUInt64(log_offset)) AS pos,
        event_id, run_id, step, task_id, rollout_index, group_size, score, action_names AS names
        FROM {db}.trajectories FINAL{where}"""
    return Source(traj, f"SELECT run_id, step, trajectory_count FROM {db}.steps FINAL{where}", True,
                  ("archive", db))


def file_source(paths: list[Path]) -> Source:
    """Avro container files (trajectory and completed-step files, any order); pos = (file index, row)."""
    trajectory_files, step_files = split_inputs(paths)
    parts = [f"""SELECT toUInt64(bitShiftLeft(toUInt64({i}), 44) + toUInt64(_row_number)) AS pos, event_id, run_id,
        step, task_id, rollout_index, group_size, score, actions.name AS names FROM file({quote_path(p)}, 'Avro')"""
             for i, p in enumerate(trajectory_files)]
    traj = " UNION ALL ".join(parts) or """SELECT toUInt64(0) AS pos, '' AS event_id, '' AS run_id,
        toInt64(0) AS step, '' AS task_id, toInt32(0) AS rollout_index, toInt32(0) AS group_size,
        toFloat64(0) AS score, CAST([], 'Array(String)') AS names WHERE 0"""
    steps = " UNION ALL ".join(f"SELECT run_id, step, trajectory_count FROM file({quote_path(p)}, 'Avro')"
                               for p in step_files) or \
        "SELECT '' AS run_id, toInt64(0) AS step, toInt32(0) AS trajectory_count WHERE 0"
    return Source(traj, steps, False, ("files", trajectory_files))


def stage_sql(t: dict[str, str], source: Source, slim: bool = False) -> list[tuple[str, str]]:
    """(table, SELECT) pairs, materialized in order as temporary tables named by `t`. `slim`: without
    event ids and rollout indexes past deduplication (the signal set needs neither; evidence does)."""
    first = f"SELECT *, toUInt64(1) AS copies FROM ({source.trajectories})" if source.unique else f"""
        SELECT min(at) AS pos, event_id, argMin(run_id, at) AS run_id, argMin(step, at) AS step,
               argMin(task_id, at) AS task_id, argMin(rollout_index, at) AS rollout_index,
               argMin(group_size, at) AS group_size, argMin(score, at) AS score, argMin(names, at) AS names,
               count() AS copies
        FROM (SELECT *, pos AS at FROM ({source.trajectories})) GROUP BY event_id"""
    return [
        # first occurrences (copies: how often each was in the log), whether valid, with hashed group
        # (run, task, step) and step (run, step) keys; later stages read the valid ones
        ("first", f"""SELECT * {'EXCEPT (event_id, rollout_index)' if slim else ''},
                             isFinite(score) AND group_size >= 1 AS valid, cityHash64(run_id, task_id, step) AS gk,
                             cityHash64(run_id, step) AS sk FROM ({first})"""),
        # each completed step's trigger: the first trajectory of its run with a higher step
        ("triggers", f"""
            WITH completions AS (SELECT run_id, step, min(trajectory_count) AS expected
                                 FROM ({source.steps}) GROUP BY run_id, step),
            steps_all AS (
                SELECT run_id, step, min(first_pos) AS first_pos, max(expected) AS expected FROM (
                    SELECT any(run_id) AS run_id, any(step) AS step, min(pos) AS first_pos,
                           CAST(NULL, 'Nullable(Int64)') AS expected
                    FROM {t['first']} WHERE valid GROUP BY sk
                    UNION ALL
                    SELECT run_id, step, toUInt64({INF}), toNullable(toInt64(expected)) FROM completions)
                GROUP BY run_id, step)
            SELECT run_id, step, expected,
                   ifNull(minOrNull(first_pos) OVER (PARTITION BY run_id ORDER BY step DESC
                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), {INF}) AS trigger_pos
            FROM steps_all"""),
        # every group's statistics over its valid rollouts, in one pass
        ("opened", f"""
            SELECT gk, any(run_id) AS run_id, any(task_id) AS task_id, any(step) AS step, any(sk) AS sk,
                   min(pos) AS p1, argMin(group_size, pos) AS gsize, count() AS n, max(pos) AS mx,
                   sumKahan(score) AS total, min(score) AS lo, max(score) AS hi
            FROM {t['first']} WHERE valid GROUP BY gk"""),
        # a group closes at its gsize-th rollout or at the first trigger after it opened (cut: the first
        # late position); `exact`: no rollout is late, so its statistics are the attempt's
        ("groups", f"""
            WITH fired AS (SELECT run_id, trigger_pos, 1 AS hit FROM {t['triggers']}
                           WHERE expected IS NOT NULL AND trigger_pos != {INF}),
            kth AS (SELECT gk, arraySort(groupArray(pos)) AS ps FROM {t['first']}
                    WHERE valid AND gk IN (SELECT gk FROM {t['opened']} WHERE n > gsize) GROUP BY gk)
            SELECT o.gk AS gk, o.run_id AS run_id, o.* EXCEPT (gk, run_id), if(f.hit = 1, f.trigger_pos, {INF}) AS close_by,
                   least(close_by, multiIf(o.n = o.gsize, o.mx + 1, o.n > o.gsize, k.ps[o.gsize] + 1, {INF})) AS cut,
                   o.n <= o.gsize AND o.mx < close_by AS exact
            FROM {t['opened']} AS o ASOF LEFT JOIN fired AS f ON o.run_id = f.run_id AND o.p1 < f.trigger_pos
            LEFT JOIN kth AS k ON o.gk = k.gk"""),
        # valid rollouts of a closed group: late
        ("late", f"""SELECT r.pos AS pos FROM {t['first']} AS r
            INNER JOIN (SELECT gk, cut FROM {t['groups']} WHERE NOT exact) AS g ON r.gk = g.gk
            WHERE r.valid AND r.pos >= g.cut"""),
        ("attempts", attempts_sql(t)),
        # rare counts a step's first max(trajectory_count, accepted before its trigger) accepted rollouts;
        # only a step with more accepted than its trajectory_count needs their positions
        ("cuts", f"""
            WITH lim AS (SELECT sk, any(run_id) AS run_id, any(step) AS step, sum(n) AS total
                         FROM {t['attempts']} GROUP BY sk),
            trig AS (SELECT cityHash64(run_id, step) AS sk, expected,
                            if(expected IS NULL, {INF}, trigger_pos) AS trig FROM {t['triggers']}),
            over AS (SELECT l.sk AS sk FROM lim AS l INNER JOIN trig AS t ON l.sk = t.sk
                     WHERE t.expected IS NOT NULL AND l.total > t.expected),
            fix AS (SELECT sk, arraySort(groupArray(pos)) AS ps FROM {t['first']}
                    WHERE valid AND sk IN (SELECT sk FROM over) AND pos NOT IN (SELECT pos FROM {t['late']})
                    GROUP BY sk)
            SELECT l.sk AS sk, l.run_id AS run_id, l.step AS step,
                   t.expected IS NULL OR l.total < t.expected AS incomplete,
                   toUInt64(greatest(t.expected, toInt64(arrayCount(x -> x < t.trig, f.ps)))) AS kk,
                   if(length(f.ps) > 0 AND kk < l.total, f.ps[kk + 1], {INF}) AS cut
            FROM lim AS l INNER JOIN trig AS t ON l.sk = t.sk LEFT JOIN fix AS f ON l.sk = f.sk"""),
        # valid rollouts not counted for rare: late, or past their step's cut
        ("excluded", f"""SELECT pos FROM {t['late']} UNION ALL
            SELECT r.pos FROM {t['first']} AS r INNER JOIN (SELECT sk, cut FROM {t['cuts']} WHERE cut != {INF}) AS c
            ON r.sk = c.sk WHERE r.valid AND r.pos >= c.cut"""),
    ]


def counted_sql(t: dict[str, str], n: int, columns: str = "") -> str:
    """The rollouts rare counts, with their `patterns` (n consecutive names joined by SEP) and any
    further `columns` of the first occurrences."""
    patterns = "names" if n == 1 else (
        f"arrayMap(i -> arrayStringConcat(arraySlice(names, i, {n}), '{SEP}'), "
        f"range(1, toUInt64(greatest(length(names) - {n} + 2, 1))))")
    return f"""SELECT sk, {columns} {patterns} AS patterns FROM {t['first']}
        WHERE valid AND pos NOT IN (SELECT pos FROM {t['excluded']})"""


def attempts_sql(t: dict[str, str]) -> str:
    """Each closed attempt, as scalars: score (sumKahan), extremes, members, close position, task key.
    A group with late rollouts is recomputed from its members."""
    recomputed = f"""
        SELECT gk, any(run_id) AS run_id, any(task_id) AS task_id, any(step) AS step, any(sk) AS sk,
               count() AS n, any(gsize) AS gsize, any(close_by) AS close_by, max(pos) AS mx,
               sumKahan(score) AS total, min(score) AS lo, max(score) AS hi
        FROM (SELECT r.*, g.gsize AS gsize, g.close_by AS close_by FROM {t['first']} AS r
              INNER JOIN (SELECT gk, gsize, close_by, cut FROM {t['groups']} WHERE NOT exact) AS g ON r.gk = g.gk
              WHERE r.valid AND r.pos < g.cut)
        GROUP BY gk"""
    return f"""
    SELECT gk, run_id, task_id, step, sk, n, total / n AS attempt_score, lo, hi,
           if(n >= gsize, mx, close_by) AS close_pos, cityHash64(run_id, task_id) AS tk
    FROM (SELECT gk, run_id, task_id, step, sk, n, gsize, close_by, mx, total, lo, hi FROM {t['groups']} WHERE exact
          UNION ALL {recomputed})"""


def _slack(tau: float) -> float:
    return 1e-9 * max(1.0, abs(tau))  # sumKahan is not exactly rounded: Python decides near tau


def attempt_sql(attempts: str, th: Thresholds, only_tasks: str | None = None) -> str:
    """Forgetting candidates and boundary attempts, with the group keys and (sumKahan) scores of the
    previous W attempts; `near`: a score within the slack of tau, which only an exact mean decides.
    `only_tasks`: a table of task keys (tk) to restrict the attempts to."""
    lookback = th.window + KEEP_CLOSED
    tau = float(th.success_threshold)
    slack = _slack(tau)
    where = f"WHERE tk IN (SELECT tk FROM {only_tasks})" if only_tasks else ""
    return f"""
    SELECT run_id, task_id, step, gk, arrayMap(p -> p.4, previous),
           attempt_score < {tau + slack} AND arrayExists(p -> p.3 >= {tau - slack}, previous) AS forgetting,
           hi >= {tau} AND lo < {tau} AS boundary, attempt_score, arrayMap(p -> p.3, previous),
           abs(attempt_score - {tau}) <= {slack} OR arrayExists(p -> abs(p.3 - {tau}) <= {slack}, previous) AS near
    FROM (SELECT *, arraySlice(arrayFilter(b -> (b.2, b.1) < (close_pos, step), before), -{th.window}) AS previous
          FROM (SELECT *, groupArray((step, close_pos, attempt_score, gk)) OVER (
                    PARTITION BY tk ORDER BY step ROWS BETWEEN {lookback} PRECEDING AND 1 PRECEDING) AS before
                FROM {attempts} {where}))
    WHERE forgetting OR boundary"""


def screen_sql(attempts: str, th: Thresholds) -> str:
    """Every attempt that raises a signal, decided with scalar windows where that is exact: `settled`
    when the W attempts before it (by step) all closed before it and no score is within the slack of
    tau; then `forgetting` is final. Unsettled ones need `attempt_sql` (and perhaps exact means)."""
    tau = float(th.success_threshold)
    slack = _slack(tau)
    return f"""
    SELECT run_id, task_id, step, gk, tk, boundary, settled, forgetting FROM (
        SELECT *, hi >= {tau} AND lo < {tau} AS boundary,
               last_close <= close_pos AND NOT near_before AND abs(attempt_score - {tau}) > {slack} AS settled,
               attempt_score < {tau} AND before > 0 AND best >= {tau} AS forgetting
        FROM (SELECT *, count() OVER w AS before, max(attempt_score) OVER w AS best,
                     max(close_pos) OVER w AS last_close, max(abs(attempt_score - {tau}) <= {slack}) OVER w AS near_before
              FROM {attempts}
              WINDOW w AS (PARTITION BY tk ORDER BY step ROWS BETWEEN {th.window} PRECEDING AND 1 PRECEDING)))
    WHERE boundary OR forgetting OR NOT settled"""


def rollouts_sql(t: dict[str, str], keys: str, slim: bool = False) -> str:
    """The rollouts (members) of the listed groups, in (rollout_index, event_id) order, as the reference
    sorts them (`slim` stages: scores only, as (0, '', score))."""
    rollout = "(toInt32(0), '', score)" if slim else "(rollout_index, event_id, score)"
    return f"""
    SELECT gk, arraySort(x -> (x.1, x.2), groupArray({rollout})) FROM {t['first']}
    WHERE valid AND gk IN (SELECT gk FROM {keys}) AND pos NOT IN (SELECT pos FROM {t['late']}) GROUP BY gk"""


def pattern_counts_sql(t: dict[str, str], n: int) -> str:
    """(sk, p, c, total) of every pattern of length `n` a step's counted rollouts used: c_p and N. One
    64-bit key per (step, pattern) (the pattern's hash is computed once per distinct name, on the
    LowCardinality dictionary). No threshold enters: every theta filters this one table."""
    return f"""
    SELECT s AS sk, p, c, sum(c) OVER (PARTITION BY s) AS total
    FROM (SELECT bitXor(sk, cityHash64(x)) AS key, any(sk) AS s, any(x) AS p, count() AS c
          FROM ({counted_sql(t, n)}) ARRAY JOIN patterns AS x GROUP BY key)"""


def rare_where(theta: float) -> str:
    """The rare rule over a pattern-count row: 0 < c_p and 100 c_p < theta N."""
    return f"c > 0 AND 100 * c < {float(theta)} * total"


def rare_sql(t: dict[str, str], th: Thresholds, keep: int) -> str:
    """Each rare pattern with its counts, the tasks that used it and the `keep` smallest event ids
    (keep 0: counts only, for the signal set without evidence)."""
    if keep == 0:
        return f"""SELECT c.run_id, c.step, r.p, c.incomplete, r.c, r.total, [], [] FROM {t['rare']} AS r
            INNER JOIN {t['cuts']} AS c ON r.sk = c.sk"""
    return f"""
    SELECT any(c.run_id), any(c.step), h.p, any(c.incomplete), any(r.c), any(r.total),
           arraySort(groupUniqArray(h.task_id)), groupArraySorted({keep})(h.event_id)
    FROM (SELECT sk, event_id, task_id, p FROM ({counted_sql(t, th.pattern_length, 'event_id, task_id,')})
          ARRAY JOIN arrayDistinct(patterns) AS p WHERE (sk, p) IN (SELECT sk, p FROM {t['rare']})) AS h
    INNER JOIN {t['rare']} AS r ON h.sk = r.sk AND h.p = r.p
    INNER JOIN {t['cuts']} AS c ON h.sk = c.sk
    GROUP BY h.sk, h.p"""
