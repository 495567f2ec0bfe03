"""The threshold sweep against one replay, over an archive of about 1M trajectories, and where one
replay's time goes.

    python -m bench.bench_sweep [--replicas R] [--repeats K]

Loads the 115,200-trajectory benchmark log R times (distinct run ids) into a chDB archive, waits for
its merges, then times, K times each: one SQL replay's signal counts (`replay_sql_lines` without an
output file) and a sweep of 36 sets (tau 0.3/0.4/0.5/0.7 x W 3/5/10 x theta 2/5/10) with the same
counts for every set. Rates count trajectory events; the sweep's per-set rate is its rate times 36.
Last, one replay with every statement timed: the seconds of each materialized stage and query.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.bench_archive import settle, write_bench_log
from bench.common import machine, report
from coevolve.services.archive.importer import import_files
from coevolve.services.clickhouse.client import connect
from coevolve.streams.replay.sql_lines import replay_sql_lines
from coevolve.streams.replay.sql_stages import archive_source
from coevolve.streams.replay.sweep import parse_sweep, sweep_sql
from coevolve.streams.rules import Thresholds

GRID = ["success_threshold=0.3,0.4,0.5,0.7", "window=3,5,10", "rare_threshold=2,5,10"]


class _Timed:
    """The client, with the seconds of every command and query kept under a short name."""

    def __init__(self, client):
        self.client, self.seconds = client, {}

    def _timed(self, method, sql, *args, **kwargs):
        words = sql.split()
        name = words[3] if words[:3] == ["CREATE", "TEMPORARY", "TABLE"] else " ".join(words[:2])
        name = name.rsplit("_", 1)[0] if name.startswith("replay_") else name
        start = time.perf_counter()
        try:
            return method(sql, *args, **kwargs)
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def command(self, sql, *args, **kwargs):
        return self._timed(self.client.command, sql, *args, **kwargs)

    def query(self, sql, *args, **kwargs):
        return self._timed(self.client.query, sql, *args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=9, help="copies of the 115,200-trajectory log")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    sweep = parse_sweep(GRID, Thresholds())
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log" / "run.avro"
        write_bench_log(log)
        client = connect(f"chdb://{tmp}/sweep")
        try:
            for r in range(args.replicas):
                import_files(client, [log], run_suffix=f"-{r}")
            settle(client)
            source = archive_source("coevolve")
            one, many = [], []
            for _ in range(args.repeats):
                stats = replay_sql_lines(client, source, Thresholds(), None, local=True)
                one.append(stats["events"] / stats["seconds"])
                results, sweep_stats = sweep_sql(client, source, sweep)
                many.append(sweep_stats["events"] / sweep_stats["seconds"])
            events = stats["events"]
            report(f"one SQL replay over the archive ({events:,} trajectories), signal counts", statistics.median(one),
                   "events/s", one)
            report(f"sweep of {len(results)} sets, every set's counts", statistics.median(many), "events/s", many)
            ratio = statistics.median(one) / statistics.median(many)
            print(f"  per set {statistics.median(many) * len(results):,.0f} events/s; the sweep costs {ratio:.2f} "
                  f"replays (stages {sweep_stats['stage_seconds']:.2f} s of {sweep_stats['seconds']:.2f} s)")
            timed = _Timed(client)
            replay_sql_lines(timed, source, Thresholds(), None, local=True)
            total = sum(timed.seconds.values())
            print(f"one replay, {total:.2f} s in statements:")
            for name, seconds in sorted(timed.seconds.items(), key=lambda kv: -kv[1]):
                print(f"  {name:<24} {seconds:6.3f} s  {100 * seconds / total:4.1f}%")
        finally:
            client.close()


if __name__ == "__main__":
    main()
