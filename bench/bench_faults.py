"""Fault-injection runs, repeated: `coevolve run --preset smoke` on the rollout fleet with the validator,
explorer, signal worker and learner each SIGKILLed once where a crash costs the most, the fleet's server
SIGKILLed during a push, the broker unreachable from the learner while it publishes a step, the explorer
starting on a backlog, one validator dual-pass call that would compute for minutes, the run's embedded
broker SIGKILLed mid-run (its log restored from the archive), the learner's and the validator's tool
hosts SIGKILLed while idle, and the validator's catalog read after its restart finding no partition (tests/faults/);
how many of the N runs lost or doubled nothing, applied each update once, and resumed past every failed
step.

    python -m bench.bench_faults [--repeats N] [--workdir DIR]

Each run's checks are those of tests/e2e/test_faults.py; a failed run's problems and the tail of its
output are printed, and its workdir is kept under DIR.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import machine
from tests.faults.scenario import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="Keep failed runs here (default: a temporary "
                                                                   "folder).")
    args = parser.parse_args()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-faults-"))
    print(f"machine: {machine()}")
    passed, seconds = 0, []
    for i in range(1, args.repeats + 1):
        workdir = root / f"run-{i:02d}"
        started = time.monotonic()
        outcome = run(workdir, f"faults-{i:02d}")
        seconds.append(time.monotonic() - started)
        passed += outcome.passed
        print(f"run {i}/{args.repeats}: {'passed' if outcome.passed else 'FAILED'} in {seconds[-1]:.0f} s, "
              f"faults fired: {', '.join(outcome.fired) or 'none'}", flush=True)
        if outcome.passed:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            for problem in outcome.problems:
                print(f"  - {problem}")
            print(f"  workdir kept: {workdir}\n  output tail:\n{outcome.output[-3000:]}", flush=True)
    print(f"{passed} of {args.repeats} fault-injection runs passed; median {statistics.median(seconds):.0f} s a run")


if __name__ == "__main__":
    main()
