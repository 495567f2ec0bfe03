"""The signal set as JSON lines, hashed and formatted by ClickHouse: the SQL replay without evidence.

Python touches only the closed attempts (thousands of rows): it decides forgetting exactly where a mean
lies within sumKahan's slack of tau (math.fsum, as the reference does), and hands the raised attempt
signals back to ClickHouse. ClickHouse then computes each id (the same SHA-256 of the same JSON text as
`streams.signals.signal_id`), formats every line, and sorts them; the bytes equal those
`write_jsonl(signals, evidence=False)` writes. JSON text needs no escaping when every string is printable
ASCII without `"` or `\\`; a line with another string comes back empty, and then the whole set is built
by the Python formatting instead.
"""
from __future__ import annotations

import json
import time

from coevolve.services.archive.sqlreplay import (SEP, Source, _mean, attempt_sql, fetch_rollouts, log_stats,
                                                 materialized, replay_sql)
from coevolve.streams.signals import EvidenceLimits, Thresholds

UNSAFE = r"[^\x20\x21\x23-\x5b\x5d-\x7e]"  # any character JSON would escape


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def lines_sql(t: dict[str, str], th: Thresholds) -> str:
    """Every raised signal's JSON line, in (run_id, step, kind, subject) order; '' where a string is unsafe."""
    key = _literal(json.dumps(th.key(), separators=(",", ":")))
    record = _literal(json.dumps(th.as_record(), separators=(",", ":")))
    unsafe = _literal(UNSAFE)
    return f"""
    SELECT if(safe, concat('{{"id":"', lower(substring(hex(SHA256(concat('["', kind, '","', run_id, '",',
                  toString(step), ',"', subject, '",', {key}, ']'))), 1, 32)),
              '","type":"', kind, '","run_id":"', run_id, '","step":', toString(step), ',"subject":"', subject,
              '","task_id":', if(kind = 'rare', 'null', concat('"', subject, '"')),
              ',"pattern":', if(kind = 'rare', concat('["', replaceAll(subject, ' > ', '","'), '"]'), '[]'),
              ',"incomplete":', if(incomplete, 'true', 'false'), ',"thresholds":', {record}, '}}'), '') AS line
    FROM (
        SELECT kind, run_id, step, subject, incomplete,
               NOT match(run_id, {unsafe}) AND NOT match(subject, {unsafe}) AND NOT position(p, ' > ') AS safe
        FROM (SELECT kind, run_id, step, task_id AS subject, false AS incomplete, '' AS p FROM {t['raised']}
              UNION ALL
              SELECT 'rare', c.run_id, c.step, replaceAll(r.p, '{SEP}', ' > '), c.incomplete, r.p
              FROM {t['rare']} AS r INNER JOIN {t['cuts']} AS c ON r.sk = c.sk))
    ORDER BY run_id, step, kind, subject"""


def replay_sql_lines(client, source: Source, thresholds: Thresholds = Thresholds()) -> tuple[bytes, dict]:
    """The signal set of the log as JSON lines without evidence; stats as `replay_sql` returns them."""
    started = time.perf_counter()
    th, tau = thresholds, thresholds.success_threshold
    with materialized(client, source, th) as t:
        attempts = client.query(attempt_sql(t["attempts"], th)).result_rows
        near = [row for row in attempts if row[9]]
        rollouts = fetch_rollouts(client, t, {k for row in near for k in (row[3], *row[4])}) if near else {}
        raised = []
        for run_id, task_id, step, gk, previous, _candidate, boundary, score, before, is_near in attempts:
            if is_near:
                score = _mean([r[2] for r in rollouts[gk]])
                before = [_mean([r[2] for r in rollouts[g]]) for g in previous]
            if score < tau and any(p >= tau for p in before):
                raised.append(["forgetting", run_id, step, task_id])
            if boundary:
                raised.append(["boundary", run_id, step, task_id])
        client.command(f"CREATE TEMPORARY TABLE {t['raised']} (kind String, run_id String, step Int64, "
                       "task_id String) ENGINE = Memory")
        if raised:
            client.insert(t["raised"], raised, column_names=["kind", "run_id", "step", "task_id"])
        body = client.raw_query(lines_sql(t, th), fmt="TabSeparatedRaw")
        events, valid = log_stats(client, t)
    stats = {"events": events, "valid": valid, "sql_seconds": time.perf_counter() - started}
    if body.startswith(b"\n") or b"\n\n" in body:  # a string that needs escaping: format in Python
        signals, _ = replay_sql(client, source, th, EvidenceLimits(), evidence=False)
        body = b"".join(json.dumps(s.to_json(evidence=False), separators=(",", ":")).encode() + b"\n"
                        for s in signals)
        stats["formatted_by"] = "python"
    stats["seconds"] = time.perf_counter() - started
    return body, stats
