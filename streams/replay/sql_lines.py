"""The signal set as JSON lines, hashed and formatted by ClickHouse: the SQL replay without evidence.

Scalar windows decide most attempts in SQL (`screen_sql`), which writes their signals to a table. Python
reads only the unsettled attempts (an earlier attempt closed after them, or a mean lies within sumKahan's
slack of tau): those it decides with `attempt_sql` and, near tau, with math.fsum as the reference does,
and adds their signals to the table. ClickHouse then computes each id (the same SHA-256 of the same
JSON text as `streams.rules.signal_id`), formats every line and sorts them; the bytes equal those
`write_jsonl(signals, evidence=False)` writes. JSON text needs no escaping when every string is
printable ASCII without `"` or `\\`; ClickHouse checks that first, on the distinct strings, and if one
is not, Python formats the whole set from the same tables instead.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from coevolve.services.clickhouse.sql import insert_rows, literal
from coevolve.streams.replay.engine_sql import exact_mean, fetch_rollouts, log_stats, materialized
from coevolve.streams.replay.report import whole_file, write_jsonl
from coevolve.streams.replay.sql_stages import Source, attempt_sql, rare_sql, screen_sql
from coevolve.streams.rules import SEP, Signal, Thresholds, forgets, rare_signal, signal_order

UNSAFE = r"[^\x20\x21\x23-\x5b\x5d-\x7e]"  # any character JSON would escape


def lines_sql(t: dict[str, str], th: Thresholds) -> str:
    """Every raised signal's JSON line, in (run_id, step, kind, subject) order (strings JSON need not
    escape: see `unsafe_sql`)."""
    key = literal(json.dumps(th.key(), separators=(",", ":")))
    record = literal(json.dumps(th.as_record(), separators=(",", ":")))
    return f"""
    SELECT concat('{{"id":"', lower(substring(hex(SHA256(concat('["', kind, '","', run_id, '",',
                  toString(step), ',"', subject, '",', {key}, ']'))), 1, 32)),
              '","type":"', kind, '","run_id":"', run_id, '","step":', toString(step), ',"subject":"', subject,
              '","task_id":', if(kind = 'rare', 'null', concat('"', subject, '"')),
              ',"pattern":', if(kind = 'rare', concat('["', replaceAll(subject, ' > ', '","'), '"]'), '[]'),
              ',"incomplete":', if(incomplete, 'true', 'false'), ',"thresholds":', {record}, '}}') AS line
    FROM (SELECT kind, run_id, step, task_id AS subject, false AS incomplete FROM {t['raised']}
          UNION ALL
          SELECT 'rare', c.run_id, c.step, replaceAll(r.p, '{SEP}', ' > '), c.incomplete
          FROM {t['rare']} AS r INNER JOIN {t['cuts']} AS c ON r.sk = c.sk)
    ORDER BY run_id, step, kind, subject"""


def unsafe_sql(t: dict[str, str]) -> str:
    """How many distinct strings of the signal set JSON would escape, and pattern names holding ' > '
    (a pattern's JSON list is cut from its subject)."""
    unsafe = literal(UNSAFE)
    return f"""
    SELECT countIf(match(v, {unsafe})) + (SELECT countIf(position(p, ' > ') > 0) FROM (SELECT DISTINCT p FROM {t['rare']}))
    FROM (SELECT DISTINCT run_id AS v FROM {t['cuts']} UNION ALL SELECT DISTINCT task_id FROM {t['raised']}
          UNION ALL SELECT DISTINCT replaceAll(p, '{SEP}', ' > ') FROM {t['rare']})"""


def _forgetting_of(client, t: dict[str, str], th: Thresholds, unsettled: dict[int, int]) -> list[list]:
    """Forgetting among the unsettled attempts: their previous W closed attempts from `attempt_sql`,
    and exact means where a score is near tau."""
    tau = th.success_threshold
    client.command(f"CREATE TEMPORARY TABLE IF NOT EXISTS {t['tasks']} (tk UInt64) ENGINE = Memory")
    client.command(f"TRUNCATE TABLE {t['tasks']}")
    insert_rows(client, t["tasks"], ([tk] for tk in set(unsettled.values())))
    rows = [row for row in client.query(attempt_sql(t["attempts"], th, t["tasks"])).result_rows if row[3] in unsettled]
    near = [row for row in rows if row[9]]
    rollouts = fetch_rollouts(client, t, {k for row in near for k in (row[3], *row[4])}, slim=True) if near else {}
    out = []
    for run_id, task_id, step, gk, previous, _candidate, _boundary, score, before, is_near in rows:
        if is_near:
            score = exact_mean([r[2] for r in rollouts[gk]])
            before = [exact_mean([r[2] for r in rollouts[g]]) for g in previous]
        if forgets(score, before, tau):
            out.append(["forgetting", run_id, step, task_id])
    return out


def raise_attempts(client, t: dict[str, str], th: Thresholds, table: str) -> int:
    """The boundary and forgetting signals of the materialized attempts under `th`, as rows (kind, run_id,
    step, task_id) of a new temporary `table` (a name of `t`, dropped with it). SQL writes the settled
    ones; Python decides the rest (`_forgetting_of`). Return how many attempts SQL could not settle."""
    screened = f"{table}_screen"
    t[screened] = screened
    client.command(f"CREATE TEMPORARY TABLE {screened} ENGINE = Memory AS {screen_sql(t['attempts'], th)}")
    client.command(f"CREATE TEMPORARY TABLE {table} (kind String, run_id String, step Int64, task_id String) "
                   "ENGINE = Memory")
    client.command(f"""INSERT INTO {table} SELECT kind, run_id, step, task_id FROM {screened} ARRAY JOIN
        arrayFilter(k -> k != '', [if(boundary, 'boundary', ''), if(settled AND forgetting, 'forgetting', '')])
        AS kind""")
    unsettled = dict(client.query(f"SELECT gk, tk FROM {screened} WHERE NOT settled").result_rows)
    if unsettled:
        insert_rows(client, table, _forgetting_of(client, t, th, unsettled))
    return len(unsettled)


def raised_counts(client, table: str) -> dict[str, int]:
    forgetting, boundary = client.query(f"SELECT countIf(kind = 'forgetting'), countIf(kind = 'boundary') "
                                        f"FROM {table}").result_rows[0]
    return {"forgetting": int(forgetting), "boundary": int(boundary)}


def raised_rows(client, table: str) -> list[list]:
    return [list(r) for r in client.query(f"SELECT kind, run_id, step, task_id FROM {table}").result_rows]


def replay_sql_lines(client, source: Source, thresholds: Thresholds, output: Path | None,
                     local: bool) -> dict:
    """Write the log's signal set to `output` as JSON lines without evidence; return stats as
    `replay_sql` does, with `counts` by kind. `local`: the client is chDB, in this process, which writes
    the file itself (INTO OUTFILE); a server's lines come back over the connection."""
    started = time.perf_counter()
    th = thresholds
    with materialized(client, source, th, slim=True) as t:
        unsettled = raise_attempts(client, t, th, t["raised"])
        counts = raised_counts(client, t["raised"])
        counts["rare"] = int(client.query(f"SELECT count() FROM {t['rare']}").result_rows[0][0])
        unsafe = 0
        if output is not None:
            unsafe = int(client.query(unsafe_sql(t)).result_rows[0][0])
            if unsafe:  # a string JSON must escape: Python formats the same lines
                write_jsonl(python_signals(client, t, th, raised_rows(client, t["raised"])), output, evidence=False)
            else:
                _write(client, lines_sql(t, th), Path(output), local)
        events, valid = log_stats(client, t)
    stats = {"events": events, "valid": valid, "unsettled": unsettled, "counts": counts,
             "sql_seconds": time.perf_counter() - started}
    if unsafe:
        stats["formatted_by"] = "python"
    stats["seconds"] = time.perf_counter() - started
    return stats


def python_signals(client, t: dict[str, str], th: Thresholds, raised: list[list]) -> list[Signal]:
    """The signals `lines_sql` would format, from the raised attempts and the materialized rare counts
    (`t['rare']`), in its order."""
    signals = [Signal(kind, run_id, step, task_id, th, task_id=task_id) for kind, run_id, step, task_id in raised]
    signals += [rare_signal(run_id, step, p, th, incomplete)
                for run_id, step, p, incomplete, *_counts in client.query(rare_sql(t, th, 0)).result_rows]
    return sorted(signals, key=signal_order)


def _write(client, select: str, output: Path, local: bool) -> None:
    """The query's lines into `output`, replaced whole."""
    with whole_file(output) as partial:
        if local:
            client.command(f"{select} INTO OUTFILE {literal(str(partial.resolve()))} FORMAT TabSeparatedRaw")
        else:
            partial.write_bytes(client.raw_query(select, fmt="TabSeparatedRaw"))
