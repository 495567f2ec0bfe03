"""Draw the analyses as PNGs (matplotlib, Agg) and gather them on one HTML page.

A view without data draws nothing: its note goes to the page and the printed tables instead, so no
plot ever shows empty axes.
"""
from __future__ import annotations

import html
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (backend first)
from matplotlib.ticker import FixedLocator, MaxNLocator  # noqa: E402

KIND_COLORS = {"forgetting": "tab:red", "boundary": "tab:orange", "rare": "tab:blue"}


def _series(rows, key_cols, x_col, y_col):
    out = defaultdict(lambda: ([], []))
    for r in rows:
        xs, ys = out[tuple(r[i] for i in key_cols)]
        if r[y_col] is not None:
            xs.append(r[x_col])
            ys.append(r[y_col])
    return out


def _save(fig, path: Path) -> Path:
    """Write the figure; every per-step axis without ticks of its own gets integer steps only."""
    for ax in fig.axes:
        if ax.get_xlabel().startswith("training step") and not isinstance(ax.xaxis.get_major_locator(), FixedLocator):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def signals_plot(view, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (run, kind), (xs, ys) in sorted(_series(view.rows, (0, 2), 1, 3).items()):
        ax.plot(xs, ys, marker="o", ms=3, color=KIND_COLORS.get(kind), label=f"{run}: {kind}",
                linestyle="-" if run == view.rows[0][0] else "--")
    ax.set(xlabel="training step", ylabel="signals raised", title=view.title)
    if view.note:
        ax.set_title(f"{view.title}\n({view.note})", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, out / "signals_per_step.png")


def validation_plot(per_step, stages, out: Path) -> Path:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (run,), (xs, ys) in sorted(_series(per_step.rows, (0,), 1, 3).items()):
        a1.plot(xs, ys, marker="o", ms=3, label=run)
    a1.set(xlabel="training step", ylabel="pass rate (validated / checked)", title=per_step.title, ylim=(0, 1.05))
    a1.legend(fontsize=8)
    runs = sorted({r[0] for r in stages.rows})
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        rows = [r for r in stages.rows if r[0] == run]
        bars = a2.bar([r[1] + i * width for r in rows], [r[4] for r in rows], width, label=run)
        a2.bar_label(bars, labels=[f"{r[4]:.2f}" for r in rows], fontsize=8)
    a2.set_xticks([s + 0.4 - width / 2 for s in sorted({r[1] for r in stages.rows})],
                  [f"stage {r[1]}\nsteps {r[2]}" for r in stages.rows if r[0] == runs[0]])
    a2.set(xlabel="training stage", ylabel="pass rate", title=stages.title, ylim=(0, 1.1))
    a2.legend(fontsize=8)
    return _save(fig, out / "validation_pass_rate.png")


def turns_plot(view, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    totals = defaultdict(int)
    for source, _turns, n in view.rows:
        totals[source] += n
    sources = sorted(totals)
    width = 0.8 / len(sources)
    for i, source in enumerate(sources):
        rows = [r for r in view.rows if r[0] == source]
        mean = sum(t * n for _, t, n in rows) / totals[source]
        ax.bar([t + i * width for _, t, _n in rows], [n / totals[source] for *_, n in rows], width,
               label=f"{source} ({totals[source]} tasks, mean {mean:.2f} turns)")
    ax.set(xlabel="interaction turns per task", ylabel="share of tasks", title=view.title)
    ax.legend(fontsize=8)
    return _save(fig, out / "turn_distribution.png")


def reward_plot(view, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (run,), (xs, ys) in sorted(_series(view.rows, (0,), 1, 2).items()):
        ax.plot(xs, ys, marker="o", ms=3, label=f"{run}: training reward")
    for (run,), (xs, ys) in sorted(_series(view.rows, (0,), 1, 3).items()):
        if xs:
            ax.plot(xs, ys, marker="s", ms=3, linestyle="--", label=f"{run}: evaluation score")
    ax.set(xlabel="training step", ylabel="score", title=view.title, ylim=(0, 1.05))
    ax.legend(fontsize=8)
    return _save(fig, out / "reward_eval.png")


def heatmap_plot(view, marks, run: str, out: Path) -> Path:
    rows = [r for r in view.rows if r[0] == run]
    tasks = sorted({r[1] for r in rows})
    steps = sorted({r[2] for r in rows})
    ti, si = {t: i for i, t in enumerate(tasks)}, {s: i for i, s in enumerate(steps)}
    grid = [[float("nan")] * len(steps) for _ in tasks]
    for _run, task, step, score in rows:
        grid[ti[task]][si[step]] = score
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(steps) + 3), max(4, 0.22 * len(tasks) + 1.5)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="mean rollout score")
    hits = [(si[s], ti[t]) for r, t, s in marks if r == run and t in ti and s in si]
    if hits:
        ax.scatter([h[0] for h in hits], [h[1] for h in hits], marker="x", color="red", s=30, label="forgetting")
        ax.legend(loc="upper left", bbox_to_anchor=(1.15, 1.0), fontsize=8)
    ax.set_xticks(range(len(steps)), steps, fontsize=7)
    ax.set_yticks(range(len(tasks)), tasks, fontsize=6)
    ax.set(xlabel="training step (blank: task not sampled)", ylabel="task", title=f"{view.title} ({run})")
    return _save(fig, out / f"task_success_{_safe(run)}.png")


def rare_plot(view, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (run, pattern), (xs, ys) in sorted(_series(view.rows, (0, 1), 2, 4).items()):
        ax.plot(xs, [100 * y for y in ys], marker=".", label=pattern if run == view.rows[0][0] else f"{run}: {pattern}")
    ax.set(xlabel="training step", ylabel="share of the step's calls (%)", title=view.title)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out / "rare_patterns.png")


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def draw_all(result: dict, out: Path) -> dict[str, list[Path]]:
    """Write every plot that has data; return view name -> files."""
    out.mkdir(parents=True, exist_ok=True)
    v = result["views"]
    files: dict[str, list[Path]] = {}
    if v["signals_per_step"].rows:
        files["signals_per_step"] = [signals_plot(v["signals_per_step"], out)]
    if v["validation_per_step"].rows:
        files["validation_per_step"] = [validation_plot(v["validation_per_step"], v["validation_per_stage"], out)]
    if v["turns"].rows:
        files["turns"] = [turns_plot(v["turns"], out)]
    if v["reward_eval"].rows:
        files["reward_eval"] = [reward_plot(v["reward_eval"], out)]
    if v["task_success"].rows:
        runs = sorted({r[0] for r in v["task_success"].rows})
        files["task_success"] = [heatmap_plot(v["task_success"], result["forgetting"], run, out) for run in runs]
    if v["rare_patterns"].rows:
        files["rare_patterns"] = [rare_plot(v["rare_patterns"], out)]
    return files


# Views whose numbers the page also shows as a table (the rest are read from their plot or `--json`).
HTML_TABLES = ("validation_per_stage", "evaluation", "pool", "time_share", "verdicts", "stage_funnel", "task_origin",
               "lineage")
HTML_ROWS = 30


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape("" if value is None else str(value))


def html_table(view, limit: int = HTML_ROWS) -> str:
    """The view's first `limit` rows as an HTML table, with how many more there are."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in view.columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in view.rows[:limit])
    more = f"<p>... {len(view.rows) - limit} more rows (<code>coevolve analyze --json</code>)</p>" \
        if len(view.rows) > limit else ""
    return f"<table border='1' cellpadding='3' style='border-collapse:collapse'><tr>{head}</tr>{body}</table>{more}"


def write_html(result: dict, files: dict[str, list[Path]], out: Path) -> Path:
    parts = [f"<html><head><meta charset='utf-8'><title>CoEvolve report</title></head><body>",
             f"<h1>CoEvolve training dynamics</h1><p>runs: {html.escape(', '.join(result['runs']))}</p>"]
    for name, view in result["views"].items():
        parts.append(f"<h2 id='{html.escape(name)}'>{html.escape(view.title)}</h2>")
        if view.note:
            parts.append(f"<p><em>{html.escape(view.note)}</em></p>")
        for f in files.get(name, []):
            parts.append(f"<img src='{html.escape(f.name)}' style='max-width:100%'>")
        if name in HTML_TABLES and view.rows:
            parts.append(html_table(view))
    parts.append("</body></html>")
    path = out / "index.html"
    path.write_text("\n".join(parts))
    return path
