"""`coevolve analyze`: the views as tables (or JSON), the plots as PNGs, and an HTML page gathering them."""
from __future__ import annotations

import json
from pathlib import Path

from coevolve.services.archive.analyze import analyze
from coevolve.services.archive.plots import draw_all, write_html
from coevolve.services.log import get_logger

log = get_logger("analyze")
MAX_ROWS = 30  # rows printed per table; --json carries them all


def _table(view) -> str:
    lines = [f"== {view.title} =="]
    if view.note:
        lines.append(f"({view.note})")
    if not view.rows:
        return "\n".join(lines)
    cells = [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in view.rows[:MAX_ROWS]]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(view.columns)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(view.columns, widths)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    if len(view.rows) > MAX_ROWS:
        lines.append(f"... {len(view.rows) - MAX_ROWS} more rows (--json prints all)")
    return "\n".join(lines)


def run_analyze(client, out: Path, database: str = "coevolve", run_ids: list[str] | None = None,
                as_json: bool = False, replayed: list | None = None) -> tuple[str, dict]:
    """Compute every view, write the plots and index.html to `out`; return (text, files by view)."""
    result = analyze(client, database, run_ids, replayed)
    files = draw_all(result, out)
    page = write_html(result, files, out)
    log.info("analyze.written", report=str(out), plots=sum(len(f) for f in files.values()))
    if as_json:
        text = json.dumps({"runs": result["runs"], "forgetting": result["forgetting"],
                           "views": {n: v.as_json() for n, v in result["views"].items()},
                           "plots": {n: [str(p) for p in f] for n, f in files.items()}}, default=str)
    else:
        text = "\n\n".join(_table(v) for v in result["views"].values())
        text += f"\n\nplots: {sum(len(f) for f in files.values())} PNG files and {page}"
    return text, files
