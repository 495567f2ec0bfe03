"""Held-out scores per task, pooled over seeds: an arm's mean with its interval, and the paired difference
of two arms over the same (seed, task) units, with the smallest difference the design detects.

Every arm of an ablation evaluates the same held-out tasks with each seed, so two arms' scores pair by
(seed, task): a task's own difficulty cancels, which is what lets few seeds resolve a difference. The
intervals are Student's t over units (a mean) or over pairs (a difference); the detectable difference is
2.80 standard errors of the paired difference (z at 97.5% plus z at 80%: a two-sided 5% test with 80%
power), the figure a study's size is chosen by.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student's t at 97.5% for 1..10 degrees of freedom; 1.96 beyond."""
POWER_80 = 2.80

Units = dict[tuple[int, str], float]
"""(seed, task id) -> the task's held-out score in that seed's run."""


def _t(df: int) -> float:
    return T975[df - 1] if df <= len(T975) else 1.96


def _standard_error(values: list[float], mean: float) -> float:
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return sd / len(values) ** 0.5


def mean_ci95(values: list[float]) -> tuple[float | None, list[float] | None]:
    """Mean and Student-t 95% interval; no interval from one value."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    half = _t(len(values) - 1) * _standard_error(values, mean)
    return mean, [mean - half, mean + half]


def units(runs: Iterable[Mapping[str, Any]]) -> Units:
    """The runs' held-out scores per (seed, task) at their last evaluation."""
    out: Units = {}
    for run in runs:
        evaluated = run.get("held_out") or {}
        if not evaluated:
            continue
        at = max(evaluated, key=int)
        for task_id, score in evaluated[at].items():
            out[(int(run["seed"]), str(task_id))] = float(score)
    return out


def paired(a: Units, b: Units) -> dict[str, Any]:
    """a - b over the units both hold: pairs, mean difference, its 95% interval and the detectable difference."""
    diffs = [a[k] - b[k] for k in sorted(set(a) & set(b))]
    mean, ci = mean_ci95(diffs)
    return {"pairs": len(diffs), "difference": mean, "ci95": ci,
            "detectable": POWER_80 * _standard_error(diffs, mean) if len(diffs) > 1 else None,
            "discordant": sum(d != 0 for d in diffs)}


def verdict(comparison: Mapping[str, Any]) -> str:
    """In words: whether the interval excludes 0, and what the design could have resolved."""
    ci = comparison["ci95"]
    if ci is None:
        return "fewer than two pairs: no interval"
    if comparison["detectable"] == 0:
        return "every pair scored alike: no difference at this budget, and none the design could resolve"
    side = "above" if ci[0] > 0 else "below" if ci[1] < 0 else None
    detect = f"this design detects {comparison['detectable']:.3f} at 80% power"
    return (f"resolved: {side} 0 at 95%; {detect}" if side else f"not resolved (the interval holds 0); {detect}")
