"""Archive inserts/s (through the broker, and insert-only) and SQL replay events/s over the archive.

    python -m bench.bench_archive [--events N] [--replicas R] [--repeats K] [--parts broker insert sql commands]

1. Publishes a simulated run of about N trajectories to the embedded broker (Tansu) and archives it
   into chDB with the archiver; the rate counts events from the first polled batch to the last stored.
2. Inserts already-decoded events straight into the archive tables, in batches of 20k events.
3. Times the SQL replay of a 115k-trajectory Avro log read by chDB directly (`--input`), then loads
   that log R times (distinct run ids, `--run-suffix`) into a chDB archive with `coevolve archive
   import`'s function, waits for its background merges, and times the SQL replay over it: the signal set
   (`--no-evidence`: ClickHouse formats the lines) and the full output (evidence included).
   Rates count trajectory events, end to end: from the first query to the JSON-lines file written.
4. The same as a user runs it (`--parts commands`): `coevolve archive import --run-suffix -r` R times,
   then `coevolve replay --clickhouse URL --no-evidence --output FILE`, a fresh process per run, by the
   rate it prints (its own timer; the process start is not counted). This process never opens the
   archive (chDB allows one process per directory); the merges are awaited in a child process.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import machine, report
from coevolve.services.archive.archiver import Archiver, RowBatch
from coevolve.services.archive.config import ArchiverConfig
from coevolve.services.archive.importer import import_files
from coevolve.services.clickhouse.client import connect, gc_paused
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.topics import create_topics
from coevolve.services.simulate import SimulationConfig, Simulator, publish, write_file
from coevolve.streams.replay.engine_sql import replay_sql
from coevolve.streams.replay.report import write_jsonl
from coevolve.streams.replay.sql_lines import replay_sql_lines
from coevolve.streams.replay.sql_stages import archive_source, file_source
from coevolve.streams.rules import Thresholds


class _TimedArchiver(Archiver):
    first = last = None

    def store(self, batch: RowBatch) -> None:
        self.first = batch.started if self.first is None else min(self.first, batch.started)
        super().store(batch)
        self.last = time.monotonic()


def bench_through_broker(tmp: Path, events: int) -> None:
    cfg = SimulationConfig(steps=max(1, events // 128), synthesized_per_step=1)
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        counts = publish(cfg, broker.bootstrap)
        archiver = _TimedArchiver(ArchiverConfig(kafka_bootstrap=broker.bootstrap, clickhouse_url=f"chdb://{tmp}/a",
                                                 idle_exit_seconds=2.0, group_id=f"bench-{uuid.uuid4().hex[:6]}"))
        stored = archiver.run()
    assert stored == sum(counts.values()), (stored, counts)
    rate = stored / (archiver.last - archiver.first)
    report("archiver via Tansu (poll+decode+insert)", rate, "events/s", [rate])


def bench_insert_only(tmp: Path, events: int, repeats: int) -> None:
    sim = list(Simulator(SimulationConfig(steps=max(1, events // 128), synthesized_per_step=1)).events())
    rates = []
    for r in range(repeats):
        client = connect(f"chdb://{tmp}/insert{r}")
        archiver = Archiver(ArchiverConfig(clickhouse_url=f"chdb://{tmp}/insert{r}"), client)
        start = time.perf_counter()
        for i in range(0, len(sim), 20_000):
            with gc_paused():  # as the archiver does around a batch
                batch = RowBatch()
                for offset, (_topic, _key, name, event) in enumerate(sim[i:i + 20_000], start=i):
                    batch.add(name, event, 0, offset)
                archiver.store(batch)
        rates.append(len(sim) / (time.perf_counter() - start))
        client.close()
    report("archive insert only (rows built + insert)", statistics.median(rates), "events/s", rates)


def settle(client, timeout_s: float = 120.0) -> None:
    """Wait for the background merges the imports started: the replays are timed, not the merges."""
    deadline = time.monotonic() + timeout_s
    while client.query("SELECT count() FROM system.merges WHERE database = 'coevolve'").result_rows[0][0]:
        if time.monotonic() > deadline:
            print("  (merges still running: figures include them)")
            return
        time.sleep(0.5)


def bench_sql_replay(tmp: Path, replicas: int, repeats: int) -> None:
    log = tmp / "log" / "run.avro"
    write_bench_log(log)
    client = connect(f"chdb://{tmp}/replay")
    try:
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            found, stats = replay_sql(client, file_source([log]))
            rates.append(stats["events"] / (time.perf_counter() - start))
        report("SQL replay of an Avro file (--input), full", statistics.median(rates), "events/s", rates)
        print(f"  ({stats['events']} trajectory events, {len(found)} signals)")
        for r in range(replicas):
            import_files(client, [log], run_suffix=f"-{r}")
        settle(client)
        rows = client.query("SELECT count() FROM coevolve.trajectories FINAL").result_rows[0][0]
        print(f"archive: {rows} trajectory events ({replicas} x 115,200), "
              f"{client.query('SELECT count() FROM coevolve.actions').result_rows[0][0]} actions")
        out = tmp / "signals.jsonl"
        for label, evidence in (("signal set, lines formatted by ClickHouse (--no-evidence)", False),
                                ("full output, evidence", True)):
            rates, signals = [], 0
            for _ in range(repeats):
                start = time.perf_counter()
                if evidence:
                    found, stats = replay_sql(client, archive_source("coevolve"), evidence=True)
                    signals = write_jsonl(found, out)
                else:
                    stats = replay_sql_lines(client, archive_source("coevolve"), Thresholds(), out, local=True)
                    signals = sum(stats["counts"].values())
                rates.append(stats["events"] / (time.perf_counter() - start))
            report(f"SQL replay over archive to a JSON-lines file: {label}", statistics.median(rates),
                   "events/s", rates)
            print(f"  ({signals} signals)")
    finally:
        client.close()


def write_bench_log(path: Path) -> None:
    write_file(SimulationConfig(run_id="bench", steps=300, tasks=60, batch_tasks=48, group_size=8), path)


def _coevolve(*args: str) -> str:
    command = [str(Path(sys.executable).with_name("coevolve")), *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def settle_url(url: str) -> None:
    """`settle` in a process of its own, so that this one never holds the chDB directory."""
    code = f"from bench.bench_archive import connect, settle; c = connect({url!r}); settle(c); c.close()"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def bench_commands(tmp: Path, replicas: int, repeats: int) -> None:
    """The user's way: `coevolve archive import` R times, then `coevolve replay --clickhouse URL
    --no-evidence --output FILE`, each a fresh process; rates as the commands' own timers report them."""
    log, url = tmp / "cmdlog" / "run.avro", f"chdb://{tmp}/commands"
    write_bench_log(log)
    rates = []
    for r in range(replicas):
        start = time.perf_counter()
        _coevolve("archive", "import", "--clickhouse", url, "--input", str(log), "--run-suffix", f"-{r}")
        rates.append(115_200 / (time.perf_counter() - start))
    report("coevolve archive import (115,200 trajectories a file, process start included)", statistics.median(rates),
           "events/s", rates)
    settle_url(url)
    rates = []
    for _ in range(repeats):
        text = _coevolve("replay", "--clickhouse", url, "--no-evidence", "--output", str(tmp / "cmd.jsonl"))
        rates.append(float(re.search(r"\(([\d,]+)/s\)", text).group(1).replace(",", "")))
    report(f"coevolve replay --clickhouse --no-evidence over {replicas * 115_200:,} trajectories (fresh process, "
           "its own timer)", statistics.median(rates), "events/s", rates)
    print(f"  ({text.splitlines()[1]})")


PARTS = ["broker", "insert", "sql", "commands"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="trajectories for the archive benchmarks")
    parser.add_argument("--replicas", type=int, default=9, help="copies of a 115k log in the replay archive")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    args, _ = parser.parse_known_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        if "broker" in args.parts:
            bench_through_broker(Path(tmp), args.events)
        if "insert" in args.parts:
            bench_insert_only(Path(tmp), args.events, args.repeats)
        if "sql" in args.parts:
            bench_sql_replay(Path(tmp), args.replicas, args.repeats)
        if "commands" in args.parts:
            bench_commands(Path(tmp), args.replicas, args.repeats)


if __name__ == "__main__":
    main()
