"""`coevolve replay --sweep`: the signals of many threshold sets in one pass over the log.

Nothing the SQL stages materialize (first occurrences, groups, closed attempts, step cuts) depends on
a threshold, so they are computed once. Then each (tau, W) screens the closed attempts for boundary and
forgetting with the functions `coevolve replay` decides them with, and each pattern length n counts the
steps' patterns once, a table every theta filters. A set's signals are therefore exactly those a replay
with that set gives.
"""
from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from coevolve.streams.replay.engine_sql import log_stats, materialized
from coevolve.streams.replay.report import signal_line, whole_file
from coevolve.streams.replay.sql_lines import (lines_sql, python_signals, raise_attempts, raised_counts, raised_rows,
                                               unsafe_sql)
from coevolve.streams.replay.sql_stages import Source, pattern_counts_sql, rare_where
from coevolve.streams.rules import KINDS, Thresholds

FIELDS = {"success_threshold": float, "window": int, "rare_threshold": float, "pattern_length": int}
SYMBOLS = {"success_threshold": "tau", "window": "W", "rare_threshold": "theta", "pattern_length": "n"}
# The thresholds each kind of signal reads; the others leave its count unchanged.
DEPENDS = {"forgetting": ("success_threshold", "window"), "boundary": ("success_threshold",),
           "rare": ("rare_threshold", "pattern_length")}


@dataclass(frozen=True)
class Sweep:
    """The base thresholds and the swept fields with their values; the sets are their product."""

    base: Thresholds
    axes: tuple[tuple[str, tuple], ...]

    def sets(self) -> list[Thresholds]:
        names = [name for name, _ in self.axes]
        return [replace(self.base, **dict(zip(names, values)))
                for values in itertools.product(*(values for _, values in self.axes))]


def parse_sweep(specs: list[str], base: Thresholds) -> Sweep:
    """`FIELD=V1,V2,...` specs (FIELD with or without `streams.`) into a Sweep; ValueError says what is
    wrong and how to write it."""
    axes: list[tuple[str, tuple]] = []
    for spec in specs:
        field, sep, text = spec.partition("=")
        name = field.strip().removeprefix("streams.")
        if not sep:
            raise ValueError(f"--sweep {spec!r}: write FIELD=V1,V2,... (for example streams.window=3,5,10)")
        if name not in FIELDS:
            raise ValueError(f"--sweep {spec!r}: unknown field {field.strip()!r}; sweep one of "
                             + ", ".join(f"streams.{f}" for f in FIELDS))
        if name in (n for n, _ in axes):
            raise ValueError(f"--sweep: streams.{name} is given twice; list all its values in one --sweep")
        items = [v.strip() for v in text.split(",")]
        if not any(items) or not all(items):
            raise ValueError(f"--sweep {spec!r}: give one or more comma-separated values, none empty")
        axes.append((name, tuple(_value(spec, name, v, base) for v in items)))
        if len(set(axes[-1][1])) < len(items):
            raise ValueError(f"--sweep {spec!r}: a value is listed twice")
    if not axes:
        raise ValueError("--sweep: give at least one FIELD=V1,V2,...")
    return Sweep(base, tuple(axes))


def _value(spec: str, name: str, text: str, base: Thresholds):
    kind = FIELDS[name]
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"--sweep {spec!r}: {text!r} is not {'an integer' if kind is int else 'a number'}") from None
    try:
        replace(base, **{name: value})
    except ValueError as exc:
        raise ValueError(f"--sweep {spec!r}: {exc}") from None
    return value


@dataclass
class SetCounts:
    thresholds: Thresholds
    counts: dict[str, int]


def sweep_sql(client, source: Source, sweep: Sweep, output: Path | None = None,
              progress: bool = False) -> tuple[list[SetCounts], dict]:
    """Every set's signal counts (and with `output`, every set's signals as JSON lines without evidence,
    set after set, each line carrying its thresholds); stats with events, valid, sets and seconds."""
    started = time.perf_counter()
    sets = sweep.sets()
    with materialized(client, source, None, slim=True) as t:
        staged = time.perf_counter() - started
        raised, attempt_counts = {}, {}
        for i, key in enumerate(_distinct((s.success_threshold, s.window) for s in sets)):
            raised[key] = t[f"raised_{i}"] = f"{t['raised']}_{i}"
            raise_attempts(client, t, replace(sweep.base, success_threshold=key[0], window=key[1]), raised[key])
            attempt_counts[key] = raised_counts(client, raised[key])
        rare_tables, rare_counts = {}, {}
        for n in _distinct(s.pattern_length for s in sets):
            table = t[f"patterns_{n}"] = f"{t['patterns']}_{n}"
            client.command(f"CREATE TEMPORARY TABLE {table} ENGINE = Memory AS {pattern_counts_sql(t, n)}")
            thetas = _distinct(s.rare_threshold for s in sets if s.pattern_length == n)
            row = client.query("SELECT " + ", ".join(f"countIf({rare_where(x)})" for x in thetas)
                               + f" FROM {table}").result_rows[0]
            for theta, count in zip(thetas, row):
                rare_tables[(n, theta)] = f"(SELECT * FROM {table} WHERE {rare_where(theta)})"
                rare_counts[(n, theta)] = int(count)
        results = []
        for th in sets:
            counts = dict(attempt_counts[(th.success_threshold, th.window)])
            counts["rare"] = rare_counts[(th.pattern_length, th.rare_threshold)]
            results.append(SetCounts(th, {k: counts[k] for k in KINDS}))
        if output is not None:
            _write(client, t, sets, raised, rare_tables, output, progress)
        events, valid = log_stats(client, t)
    return results, {"events": events, "valid": valid, "sets": len(sets), "stage_seconds": staged,
                     "seconds": time.perf_counter() - started}


def _distinct(values) -> list:
    return list(dict.fromkeys(values))


def _write(client, t: dict[str, str], sets: list[Thresholds], raised: dict, rare_tables: dict, output: Path,
           progress: bool) -> None:
    """Each set's signals, in the order and form `coevolve replay --no-evidence --output` writes them:
    formatted by ClickHouse (`lines_sql`), or by Python where a string needs escaping."""
    from tqdm import tqdm

    with whole_file(output) as partial, open(partial, "wb") as fh, \
            tqdm(sets, desc="sweep output", unit="set", file=sys.stderr, disable=not progress, leave=False) as bar:
        for th in bar:
            table = raised[(th.success_threshold, th.window)]
            t_set = {**t, "raised": table, "rare": rare_tables[(th.pattern_length, th.rare_threshold)]}
            if int(client.query(unsafe_sql(t_set)).result_rows[0][0]):
                fh.writelines(signal_line(s, evidence=False).encode()
                              for s in python_signals(client, t_set, th, raised_rows(client, table)))
            else:
                fh.write(client.raw_query(lines_sql(t_set, th), fmt="TabSeparatedRaw"))
