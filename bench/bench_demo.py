"""`make run`, repeated: the `demo` preset end to end, each run in a fresh workdir, with its wall time,
the machine's memory peak while it ran, whether the loop closed (a validated task trained on), and
whether the signals steered it: validated and trained-on tasks by strategy, and the targeting share.

    python -m bench.bench_demo [--repeats 3] [--workdir DIR] [--cold]

Memory is the machine's (MemTotal - MemAvailable, sampled every 0.5 s), the figure the bound on
`make run` is about: every process of the run, the embedded broker and the page cache it cannot
give back. `--cold` deletes the converted and the warmed SmolLM2 before the first run, so that run pays
the conversion and the warm-up as a fresh machine would (the pip install apart). Each run's
summary.json stays in DIR.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import machine
from coevolve.services.agent.config import default_home
from coevolve.services.run.shape import shape_line


def used_mib() -> int:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])
    return kib // 1024


def run_once(workdir: Path) -> dict:
    peak, done = [used_mib()], threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], used_mib())
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    coevolve = Path(sys.executable).parent / "coevolve"
    proc = subprocess.run([str(coevolve), "run", "--preset", "demo", "--workdir", str(workdir)],
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    done.set()
    sampler.join()
    out = {"exit_code": proc.returncode, "seconds": round(seconds, 1), "memory_peak_mib": peak[0],
           "tail": proc.stdout[-1500:] + proc.stderr[-1500:]}
    summary = workdir / "summary.json"
    if summary.exists():
        doc = json.loads(summary.read_text())
        out |= {k: doc.get(k) for k in ("state", "tasks_validated", "synthesized_trained", "first_synthesized_step",
                                        "loop_silent", "wall_seconds", "signals", "explorations", "origin",
                                        "targeting", "dead_letters", "task_shape", "repair")}
    return out


def steered(result: dict) -> bool:
    """Whether a task validated from a signal-guided exploration was trained on."""
    return bool(((result.get("origin") or {}).get("trained") or {}).get("signal-guided"))


def _origin(result: dict) -> str:
    origin = result.get("origin") or {}
    parts = [f"{key} {json.dumps(origin.get(key) or {}, sort_keys=True)}" for key in ("validated", "trained")]
    targeting = ", ".join(f"{k} {t['targeted']}/{t['tasks']}" for k, t in (result.get("targeting") or {}).items())
    no_task = {k: n for k, n in (result.get("dead_letters") or {}).items() if k.endswith(": no_task")}
    return "; ".join(parts) + f"; targeting {targeting or 'n/a'}; no_task dead letters {no_task or 0}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="Where the runs go (default: a temporary folder).")
    parser.add_argument("--cold", action="store_true", help="Convert and warm the policy anew in the first run.")
    args = parser.parse_args()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-demo-"))
    print(f"machine: {machine()}")
    if args.cold:
        for path in (default_home() / "models").glob("smollm2-135m-instruct*"):
            if path.is_dir():
                shutil.rmtree(path)
    runs = []
    for i in range(1, args.repeats + 1):
        result = run_once(root / f"run-{i:02d}")
        runs.append(result)
        print(f"run {i}/{args.repeats}: exit {result['exit_code']}, {result['seconds']:.0f} s, memory peak "
              f"{result['memory_peak_mib'] / 1024:.1f} GiB, validated {result.get('tasks_validated')}, synthesized "
              f"rollouts trained on {result.get('synthesized_trained')} (first at step "
              f"{result.get('first_synthesized_step')}), wall {result.get('wall_seconds')}", flush=True)
        print(f"  origin: {_origin(result)}", flush=True)
        if result.get("task_shape"):
            print(f"  {shape_line(result['task_shape'])}", flush=True)
        if result.get("loop_silent"):
            print(f"  loop_silent: {result['loop_silent']}")
        if result["exit_code"]:
            print(result["tail"])
    (root / "bench_demo.json").write_text(json.dumps({"machine": machine(), "runs": runs}, indent=2) + "\n")
    closed = sum(bool(r.get("synthesized_trained")) for r in runs)
    median = statistics.median(r["seconds"] for r in runs)
    peak = max(r["memory_peak_mib"] for r in runs) / 1024
    print(f"{closed} of {len(runs)} runs trained on a synthesized task, {sum(map(steered, runs))} on one validated "
          f"from a signal-guided exploration; median {median:.0f} s, memory peak max {peak:.1f} GiB; runs in {root}")


if __name__ == "__main__":
    main()
