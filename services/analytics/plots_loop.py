"""Draw the loop's views (`loop.py`): evaluation curve, task pool, step time, explorations, verdicts.

Data shaping is in small pure functions (tested without drawing); a run gets its own row of axes where
bars would otherwise overlap.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from coevolve.services.analytics.loop import PHASES, VALIDATION_STAGES
from coevolve.services.analytics.plots import _save, _series, plt

PHASE_COLORS = dict(zip(PHASES, ("tab:blue", "tab:cyan", "tab:green", "tab:purple", "tab:olive", "tab:red")))
STRATEGY_COLORS = {"signal-guided": "tab:green", "random": "tab:gray", "random-calls": "tab:brown",
                   "random-fallback": "tab:orange", "static": "tab:purple"}


def stacked(rows, run: str, step_col: int, group_col: int, value_col: int) -> tuple[list, dict[str, list]]:
    """For one run: the steps, and per group its value at each step (0 where it has none)."""
    mine = [r for r in rows if r[0] == run]
    steps = sorted({r[step_col] for r in mine})
    at = {s: i for i, s in enumerate(steps)}
    out: dict[str, list] = {}
    for r in mine:
        out.setdefault(r[group_col], [0] * len(steps))[at[r[step_col]]] += r[value_col]
    return steps, out


def rejections_by_stage(rows) -> dict[str, dict[str, int]]:
    """Per run, tasks per deciding stage (verdicts view rows), in the validator's order, `passed` last."""
    order = {s: i for i, s in enumerate(VALIDATION_STAGES)}
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for run, _verdict, stage, _reason, n in rows:
        out[run][stage] = out[run].get(stage, 0) + n
    return {run: dict(sorted(c.items(), key=lambda kv: (kv[0] == "passed", order.get(kv[0], 99), kv[0])))
            for run, c in out.items()}


def top_reasons(rows, limit: int = 10, width: int = 60) -> list[tuple[str, int]]:
    """The most frequent rejection reasons over all runs, as `stage: reason` (shortened), most first."""
    counts: dict[str, int] = defaultdict(int)
    for _run, verdict, stage, reason, n in rows:
        if verdict == "rejected":
            counts[f"{stage}: {reason}" if reason else stage] += n
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    return [(text if len(text) <= width else text[:width - 1] + "…", n) for text, n in top]


def _runs(rows) -> list[str]:
    return sorted({r[0] for r in rows})


def evaluation_plot(view, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (run, split), (xs, ys) in sorted(_series(view.rows, (0, 1), 2, 4).items()):
        line, = ax.plot(xs, ys, marker="o", ms=4, label=f"{run} ({split}): success rate")
        _, means = _series([r for r in view.rows if r[0] == run and r[1] == split], (0,), 2, 5)[(run,)]
        ax.plot(xs, means, linestyle="--", color=line.get_color(), label=f"{run} ({split}): mean partial score")
    ax.set(xlabel="training step", ylabel="held-out score", title=view.title, ylim=(0, 1.05))
    ax.legend(fontsize=8)
    return _save(fig, out / "evaluation.png")


def pool_plot(view, out: Path) -> Path:
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.2))
    for (run,), (xs, ys) in sorted(_series(view.rows, (0,), 1, 2).items()):
        line, = a1.plot(xs, ys, marker="o", ms=3, label=f"{run}: pool")
        _, synth = _series([r for r in view.rows if r[0] == run], (0,), 1, 3)[(run,)]
        a1.plot(xs, synth, linestyle="--", color=line.get_color(), label=f"{run}: synthesized")
    a1.set(xlabel="training step", ylabel="tasks", title="Tasks in the sampler's pool")
    a1.legend(fontsize=8)
    for (run,), (xs, ys) in sorted(_series(view.rows, (0,), 1, 4).items()):
        a2.plot(xs, ys, marker="o", ms=3, label=run)
    a2.set(xlabel="training step", ylabel="synthesized / pool", title="Synthesized share of the pool", ylim=(0, 1.05))
    a2.legend(fontsize=8)
    runs = sorted(_series(view.rows, (0,), 1, 5).items())
    width = 0.8 / max(len(runs), 1)
    for i, ((run,), (xs, ys)) in enumerate(runs):
        a3.bar([x + (i - (len(runs) - 1) / 2) * width for x in xs], [y or 0 for y in ys], width, label=run)
    a3.set(xlabel="training step", ylabel="rollouts", title="Synthesized rollouts trained on")
    a3.legend(fontsize=8)
    return _save(fig, out / "task_pool.png")


def _run_axes(runs: list[str], title: str):
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs) + 0.8), squeeze=False)
    fig.suptitle(title)
    return fig, [a[0] for a in axes]


def step_time_plot(per_step, share, out: Path) -> Path:
    runs = _runs(per_step.rows)
    fig, axes = _run_axes(runs, per_step.title)
    blocked = {r[0]: r[-1] for r in share.rows}
    parts = (*PHASES, "other")
    for ax, run in zip(axes, runs):
        mine = [r for r in per_step.rows if r[0] == run]
        steps = [r[1] for r in mine]
        bottom = [0.0] * len(mine)
        for i, part in enumerate(parts):
            values = [r[2 + i] for r in mine]
            ax.bar(steps, values, bottom=bottom, color=PHASE_COLORS.get(part, "lightgray"), label=part)
            bottom = [b + v for b, v in zip(bottom, values)]
        share_text = f"blocked share {100 * blocked[run]:.2f}%" if blocked.get(run) is not None else ""
        ax.set(xlabel="training step", ylabel="seconds", title=f"{run}  {share_text}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, out / "step_time.png")


def explorations_plot(view, out: Path) -> Path:
    runs = _runs(view.rows)
    fig, axes = _run_axes(runs, view.title)
    for ax, run in zip(axes, runs):
        steps, by = stacked(view.rows, run, 1, 2, 3)
        bottom = [0] * len(steps)
        for strategy, values in sorted(by.items()):
            ax.bar(steps, values, bottom=bottom, color=STRATEGY_COLORS.get(strategy),
                   label=f"{strategy} ({sum(values)})")
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set(xlabel="training step", ylabel="explorations", title=run)
        ax.legend(fontsize=8)
    return _save(fig, out / "explorations.png")


def verdicts_plot(by_reason, out: Path) -> Path:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 1.3]})
    counts = rejections_by_stage(by_reason.rows)
    stages = list(dict.fromkeys(s for c in counts.values() for s in c))
    order = {s: i for i, s in enumerate(VALIDATION_STAGES)}
    stages.sort(key=lambda s: (s == "passed", order.get(s, 99), s))
    width = 0.8 / max(1, len(counts))
    for i, (run, c) in enumerate(sorted(counts.items())):
        bars = a1.bar([j + i * width for j in range(len(stages))], [c.get(s, 0) for s in stages], width, label=run)
        a1.bar_label(bars, fontsize=7)
    a1.set_xticks([j + 0.4 - width / 2 for j in range(len(stages))],
                  [s if s != "passed" else "validated" for s in stages], fontsize=8)
    a1.set(xlabel="stage that decided the verdict", ylabel="synthesized tasks", title=by_reason.title)
    a1.legend(fontsize=8)
    reasons = top_reasons(by_reason.rows)
    if reasons:
        a2.barh(range(len(reasons)), [n for _, n in reasons], color="tab:red")
        a2.set_yticks(range(len(reasons)), [t for t, _ in reasons], fontsize=7)
        a2.invert_yaxis()
    a2.set(xlabel="rejected tasks", title="Most frequent rejection reasons")
    return _save(fig, out / "verdicts.png")


def origin_plot(view, out: Path) -> Path:
    """Validated and trained-on tasks per strategy (signal-guided split by signal kind), one panel per run."""
    runs = _runs(view.rows)
    fig, axes = _run_axes(runs, view.title)
    for ax, run in zip(axes, runs):
        mine = [r for r in view.rows if r[0] == run]
        labels = [f"{r[1]}\n({r[2]})" if r[2] else r[1] for r in mine]
        x = list(range(len(mine)))
        colors = [STRATEGY_COLORS.get(r[1], "lightgray") for r in mine]
        ax.bar([i - 0.2 for i in x], [r[3] for r in mine], 0.4, color=colors, alpha=0.45, label="validated")
        bars = ax.bar([i + 0.2 for i in x], [r[4] for r in mine], 0.4, color=colors, label="trained on")
        ax.bar_label(bars, fontsize=8)
        ax.set_xticks(x, labels, fontsize=8)
        ax.set(ylabel="synthesized tasks", title=run)
        ax.legend(fontsize=8)
    return _save(fig, out / "task_origin.png")


def draw_loop(views: dict, out: Path) -> dict[str, list[Path]]:
    """Every loop plot that has data; return view name -> files."""
    files: dict[str, list[Path]] = {}
    if views["evaluation"].rows:
        files["evaluation"] = [evaluation_plot(views["evaluation"], out)]
    if views["pool"].rows:
        files["pool"] = [pool_plot(views["pool"], out)]
    if views["step_time"].rows:
        files["step_time"] = [step_time_plot(views["step_time"], views["time_share"], out)]
    if views["explorations"].rows:
        files["explorations"] = [explorations_plot(views["explorations"], out)]
    if views["verdicts"].rows:
        files["verdicts"] = [verdicts_plot(views["verdicts"], out)]
    if views["task_origin"].rows:
        files["task_origin"] = [origin_plot(views["task_origin"], out)]
    return files
