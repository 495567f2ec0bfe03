"""How long a record waits between its publish and its place in the kept log: what a broker that dies
would take with it.

    python -m bench.bench_log_window --workdir .coevolve [--log-id RUN]

Over a `coevolve run`'s archive (its archiver keeps the embedded broker's log, `archiver.log_id`): per
topic, the records kept and the median, 99th percentile and maximum of `archived_at` minus the record's
timestamp (set by its producer as it sent it). Anything younger than that at the broker's death is lost.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import machine
from coevolve.services.clickhouse.client import chdb_url, connect

SQL = """SELECT topic, count(), quantiles(0.5, 0.99, 1)(dateDiff('millisecond', fromUnixTimestamp64Milli(timestamp_ms),
                archived_at)) FROM coevolve.log WHERE log_id = {log_id:String} GROUP BY topic ORDER BY topic"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".coevolve"))
    parser.add_argument("--log-id", default="", help="The run whose log to measure (default: the latest run).")
    args = parser.parse_args()
    log_id = args.log_id or json.loads((args.workdir / "run.json").read_text())["run_id"]
    client = connect(chdb_url(args.workdir), create=False)
    try:
        rows = client.query(SQL, parameters={"log_id": log_id}).result_rows
    finally:
        client.close()
    print(f"log {log_id} in {args.workdir}; {machine()}")
    print(f"{'topic':26s} {'records':>8s} {'median ms':>10s} {'p99 ms':>8s} {'max ms':>8s}")
    for topic, count, (p50, p99, top) in rows:
        print(f"{topic:26s} {count:8d} {p50:10.0f} {p99:8.0f} {top:8.0f}")


if __name__ == "__main__":
    main()
