"""`coevolve replay --engine sql`: run the stages of `sql_stages` in ClickHouse and build the signals.

Each stage is materialized as a temporary table (dropped afterwards); the final comparison of means
near tau uses math.fsum, as streams/rules.py does; the evidence of raised signals is fetched from the
source (`sources.evidence_of`).
"""
from __future__ import annotations

import contextlib
import math
import time
import uuid

from coevolve.services.clickhouse.client import gc_paused
from coevolve.services.clickhouse.sql import insert_rows, jit_off
from coevolve.streams.replay.sources import evidence_of
from coevolve.streams.replay.sql_stages import (Source, attempt_sql, pattern_counts_sql, rare_sql, rare_where,
                                                rollouts_sql, stage_sql)
from coevolve.streams.rules import EvidenceLimits, Signal, Thresholds, forgets, rare_signal, signal_order


def exact_mean(scores) -> float:
    """An attempt's score exactly as the reference computes it (ClickHouse has no exactly rounded sum)."""
    return math.fsum(scores) / len(scores)


def replay_sql(client, source: Source, thresholds: Thresholds = Thresholds(),
               limits: EvidenceLimits = EvidenceLimits(), evidence: bool = True) -> tuple[list[Signal], dict]:
    """Every signal of the log, computed in SQL; evidence trajectories fetched for the raised ones.

    Returns (signals sorted by run, step, kind, subject; stats with events, accepted and seconds)."""
    with gc_paused():  # result rows become signals: many short-lived objects, no cycles
        return _replay_sql(client, source, thresholds, limits, evidence)


STAGES = ("first", "triggers", "opened", "groups", "late", "attempts", "cuts", "excluded", "keys", "patterns",
          "rare", "raised", "tasks")


@contextlib.contextmanager
def materialized(client, source: Source, th: Thresholds | None, slim: bool = False):
    """Every stage of `stage_sql` as temporary tables, and with thresholds `th` the step's pattern counts
    (`patterns`) and its rare ones (`rare`); yields their names (`t`), and drops them all afterwards
    (`t` may gain tables meanwhile). JIT compilation is off meanwhile (`jit_off`)."""
    tag = uuid.uuid4().hex[:8]
    t = {name: f"replay_{name}_{tag}" for name in STAGES}
    with jit_off(client), _dropped(client, t):
        for name, select in stage_sql(t, source, slim):
            client.command(f"CREATE TEMPORARY TABLE {t[name]} ENGINE = Memory AS {select}")
        if th is not None:
            client.command(f"CREATE TEMPORARY TABLE {t['patterns']} ENGINE = Memory AS "
                           f"{pattern_counts_sql(t, th.pattern_length)}")
            client.command(f"CREATE TEMPORARY TABLE {t['rare']} ENGINE = Memory AS "
                           f"SELECT * FROM {t['patterns']} WHERE {rare_where(th.rare_threshold)}")
        yield t


@contextlib.contextmanager
def _dropped(client, t: dict[str, str]):
    try:
        yield
    finally:
        for table in t.values():
            client.command(f"DROP TEMPORARY TABLE IF EXISTS {table}")


def log_stats(client, t: dict[str, str]) -> tuple[int, int]:
    """(trajectory events in the log, valid first occurrences)."""
    events, valid = client.query(f"SELECT sum(copies), countIf(valid) FROM {t['first']}").result_rows[0]
    return int(events), int(valid)


def fetch_rollouts(client, t: dict[str, str], keys, slim: bool = False) -> dict[int, list]:
    """Group key -> its rollouts (rollout_index, event_id, score), for the given group keys."""
    client.command(f"CREATE TEMPORARY TABLE IF NOT EXISTS {t['keys']} (gk UInt64) ENGINE = Memory")
    client.command(f"TRUNCATE TABLE {t['keys']}")
    insert_rows(client, t["keys"], ([k] for k in keys))
    return dict(client.query(rollouts_sql(t, t["keys"], slim)).result_rows)


def _replay_sql(client, source: Source, thresholds: Thresholds, limits: EvidenceLimits,
                evidence: bool) -> tuple[list[Signal], dict]:
    started = time.perf_counter()
    th = thresholds
    with materialized(client, source, th) as t:
        attempts = client.query(attempt_sql(t["attempts"], th)).result_rows
        rollouts = fetch_rollouts(client, t, {k for row in attempts for k in (row[3], *row[4])})
        keep = limits.rare_trajectories if evidence else 0
        rare = client.query(rare_sql(t, th, keep)).result_rows
        sql_seconds = time.perf_counter() - started
        trajectories = {}
        if evidence:
            wanted = {r[1] for row in attempts for r in rollouts[row[3]]} | {i for row in rare for i in row[7]}
            trajectories = evidence_of(client, wanted, source.evidence, limits)
        stats = log_stats(client, t)
    signals: list[Signal] = []
    tau = th.success_threshold
    for run_id, task_id, step, gk, previous, candidate, boundary, *_sql_scores in attempts:
        ids, scores = [r[1] for r in rollouts[gk]], [r[2] for r in rollouts[gk]]
        score, before = exact_mean(scores), [exact_mean([r[2] for r in rollouts[g]]) for g in previous]
        forgetting = candidate and forgets(score, before, tau)
        ev = {"scores": list(scores), "attempt_score": score, "previous_scores": before,
              "trajectories": [trajectories[i] for i in ids if i in trajectories]}
        for kind, raised in (("forgetting", forgetting), ("boundary", boundary)):
            if raised:
                signals.append(Signal(kind, run_id, step, task_id, th, task_id=task_id, evidence=ev))
    for run_id, step, p, incomplete, c, total, task_ids, ids in rare:
        signals.append(rare_signal(run_id, step, p, th, incomplete, {
            "pattern_count": c, "pattern_total": total, "task_ids": list(task_ids),
            "trajectories": [trajectories[i] for i in ids if i in trajectories]}))
    signals.sort(key=signal_order)
    return signals, {"events": stats[0], "valid": stats[1], "sql_seconds": sql_seconds,
                     "seconds": time.perf_counter() - started}
