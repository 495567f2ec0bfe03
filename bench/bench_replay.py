"""Replay throughput: trajectory events/s from an Avro log file to a JSON-lines signal file, end to end.

    python -m bench.bench_replay [--events N] [--workers 1 2] [--repeats R]

Writes a simulated run with `coevolve simulate --output`, then times what `coevolve replay --input`
does: `replay_files` (open, decode, the pure signal functions, close every group and step, evidence)
and `write_jsonl`. With the chDB decoder: the full output, and the signal set alone (`--no-evidence`:
no evidence fetched or written); with fastavro in each number of decoding processes (--workers): the
full output.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import machine, report
from coevolve.services.simulate import SimulationConfig, write_file
from coevolve.streams.replay.engine_python import replay_files
from coevolve.streams.replay.report import write_jsonl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="fastavro decoding processes")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.avro"
        counts, _files = write_file(SimulationConfig(steps=max(1, args.events // 128), synthesized_per_step=0), path)
        print(f"log: {counts['TrajectoryRecorded']} trajectories, {path.stat().st_size / 2**20:.1f} MiB")
        runs = [("chdb", 1, True), ("chdb", 1, False)] + [("fastavro", w, True) for w in args.workers]
        for decoder, workers, evidence in runs:
            rates, signals = [], 0
            for _ in range(args.repeats):
                start = time.perf_counter()
                result = replay_files([path], workers=workers, decoder=decoder, evidence=evidence)
                signals = write_jsonl(result.signals, Path(tmp) / "signals.jsonl", evidence)
                rates.append(result.events / (time.perf_counter() - start))
            label = "chDB decoder" if decoder == "chdb" else f"fastavro, {workers} decoding process(es)"
            label += "" if evidence else ", signal set only (--no-evidence)"
            report(f"replay to JSON lines, {label}, {signals} signals", statistics.median(rates), "events/s", rates)


if __name__ == "__main__":
    main()
