"""Shared helpers for benchmarks: repeated timing with medians, and a machine description."""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable


def machine() -> str:
    """One line naming the machine, for quoting next to a figure."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem:.0f} GiB, {cpu}, Python {platform.python_version()}"


def median_rate(fn: Callable[[], int], repeats: int = 5) -> tuple[float, list[float]]:
    """Run `fn` (which returns how many items it processed) `repeats` times; median items/s and all."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates), rates


def report(name: str, rate: float, unit: str, rates: list[float]) -> None:
    spread = ", ".join(f"{r:,.0f}" for r in rates)
    print(f"{name:40s} median {rate:>12,.0f} {unit}   (runs: {spread})")
