"""Processes sharing the cores: one training-like loop beside two decoding-like loops, as in `coevolve run`.

    python -m bench.bench_threads [--seconds 15] [--repeats 3]

The learner trains (large matmuls) while the explorer and validator decode (many small ops), each a
process with its own torch. Each layout runs the three loops at once for `--seconds` and reports each
loop's iterations/s: every process on torch's default threads (one per core), and the side loops on
one thread (`cpu_threads: 1`, what the demo and smoke presets give the explorer and validator). Then
each loop alone on the default threads, for reference.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from bench.common import machine

LOOP = """
import sys, time, torch
kind, seconds, threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(0)
if kind == "train":
    a, w = torch.randn(2048, 576), torch.randn(576, 1536)
    step = lambda: (a @ w).relu_().sum()
else:
    x, w = torch.randn(8, 576), torch.randn(576, 576)
    def step():
        y = x
        for _ in range(30):
            y = torch.tanh(y @ w)
step()
n, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    step()
    n += 1
print(n / (time.perf_counter() - start))
"""


def run_together(loops: list[tuple[str, int]], seconds: float) -> list[float]:
    """Start every (kind, threads) loop at once; their iterations/s."""
    procs = [subprocess.Popen([sys.executable, "-c", LOOP, kind, str(seconds), str(threads)],
                              stdout=subprocess.PIPE, text=True) for kind, threads in loops]
    return [float(p.communicate()[0]) for p in procs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    layouts = {
        "alone: train": [("train", 0)],
        "alone: decode": [("decode", 0)],
        "together, default threads": [("train", 0), ("decode", 0), ("decode", 0)],
        "together, side loops on 1 thread": [("train", 0), ("decode", 1), ("decode", 1)],
    }
    for name, loops in layouts.items():
        runs = []
        for _ in range(args.repeats):
            runs.append(run_together(loops, args.seconds))
            time.sleep(1)
        medians = [statistics.median(r[i] for r in runs) for i in range(len(loops))]
        shown = ", ".join(f"{kind} {m:,.1f}" for (kind, _), m in zip(loops, medians))
        print(f"{name:36s} median iterations/s: {shown}")


if __name__ == "__main__":
    main()
