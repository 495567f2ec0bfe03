"""A sweep's counts as a user reads them: a terminal table, JSON lines, a Markdown table and a heatmap
per kind of signal over the thresholds that kind reads (`sweep.DEPENDS`)."""
from __future__ import annotations

import json
from pathlib import Path

from coevolve.streams.replay.sweep import DEPENDS, SYMBOLS, SetCounts, Sweep
from coevolve.streams.rules import KINDS


def _label(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def sweep_rows(sweep: Sweep, results: list[SetCounts]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): the swept thresholds, then the count of each kind and the total."""
    names = [name for name, _ in sweep.axes]
    header = [SYMBOLS[n] for n in names] + list(KINDS) + ["total"]
    rows = [[_label(getattr(r.thresholds, n)) for n in names] + [str(r.counts[k]) for k in KINDS]
            + [str(sum(r.counts.values()))] for r in results]
    return header, rows


def sweep_table(sweep: Sweep, results: list[SetCounts], stats: dict) -> str:
    """The terminal's report: what was read, how fast, and the counts of every set."""
    header, rows = sweep_rows(sweep, results)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fixed = {SYMBOLS[f]: _label(getattr(sweep.base, f)) for f in SYMBOLS if f not in dict(sweep.axes)}
    rate = stats["events"] / stats["seconds"] if stats["seconds"] else 0.0
    lines = [f"swept {stats['sets']} threshold sets over {stats['events']} trajectory events in "
             f"{stats['seconds']:.2f} s ({rate:,.0f} events/s; stages {stats['stage_seconds']:.2f} s, once)",
             "fixed: " + (" ".join(f"{k}={v}" for k, v in fixed.items()) or "none"),
             "  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def write_sweep_report(sweep: Sweep, results: list[SetCounts], stats: dict, out: Path) -> list[Path]:
    """sweep.jsonl (a line per set), sweep.md and sweep_<kind>.png in `out`; return the files."""
    out.mkdir(parents=True, exist_ok=True)
    lines = out / "sweep.jsonl"
    lines.write_text("".join(json.dumps({"thresholds": r.thresholds.as_record(), "counts": r.counts},
                                        separators=(",", ":")) + "\n" for r in results))
    header, rows = sweep_rows(sweep, results)
    md = out / "sweep.md"
    md.write_text("\n".join([f"# Threshold sweep: {stats['sets']} sets over {stats['events']} trajectory events",
                             "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                             *("| " + " | ".join(r) + " |" for r in rows)]) + "\n")
    return [lines, md] + [heatmap(sweep, results, kind, out) for kind in KINDS]


def heatmap(sweep: Sweep, results: list[SetCounts], kind: str, out: Path) -> Path:
    """The kind's counts over the swept thresholds it reads (rows: the first, columns: the second); the
    other thresholds do not change them. A kind that reads no swept threshold is one cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = [(name, values) for name, values in sweep.axes if name in DEPENDS[kind]][:2]
    (ry, ys), (rx, xs) = ([(None, (None,))] * (2 - len(axes)) + axes)[-2:]
    cell = {}
    for r in results:
        cell.setdefault((getattr(r.thresholds, ry) if ry else None, getattr(r.thresholds, rx) if rx else None),
                        r.counts[kind])
    grid = [[cell[(y, x)] for x in xs] for y in ys]
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(xs), 1.4 + 0.6 * len(ys)))
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    low, high = min(map(min, grid)), max(map(max, grid))
    for i, row in enumerate(grid):
        for j, count in enumerate(row):  # dark text on the bright half of viridis
            ax.text(j, i, str(count), ha="center", va="center", fontsize=9,
                    color="black" if count - low > (high - low) / 2 else "white")
    ax.set_xticks(range(len(xs)), [_label(x) for x in xs] if rx else [""])
    ax.set_yticks(range(len(ys)), [_label(y) for y in ys] if ry else [""])
    ax.set(xlabel=SYMBOLS[rx] if rx else "", ylabel=SYMBOLS[ry] if ry else "",
           title=f"{kind} signals" + ("" if axes else " (reads no swept threshold)"))
    fig.colorbar(image, ax=ax, label="signals")
    fig.tight_layout()
    path = out / f"sweep_{kind}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
