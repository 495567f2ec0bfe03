"""`coevolve analyze`: the views as tables (or JSON), the plots as PNGs, and an HTML page gathering them."""
from __future__ import annotations

import json
from pathlib import Path

from coevolve.services.analytics.analyze import analyze
from coevolve.services.analytics.plots import draw_all, write_html
from coevolve.services.analytics.plots_loop import draw_loop
from coevolve.services.runtime.log import get_logger

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


def _replay_if_no_signals(client, database: str) -> list | None:
    """Signals recomputed in SQL (default thresholds) when the archive holds no SignalRaised events."""
    from coevolve.streams.replay.engine_sql import replay_sql
    from coevolve.streams.replay.sql_stages import archive_source

    if client.query(f"SELECT count() FROM {database}.signals").result_rows[0][0]:
        return None
    signals, stats = replay_sql(client, archive_source(database), evidence=False)
    log.info("analyze.replayed", signals=len(signals), events=stats["events"], seconds=round(stats["seconds"], 3))
    return signals


def run_analyze(client, out: Path, database: str = "coevolve", run_ids: list[str] | None = None,
                as_json: bool = False) -> tuple[str, dict]:
    """Compute every view, write the plots and index.html to `out`; return (text, files by view)."""
    result = analyze(client, database, run_ids, _replay_if_no_signals(client, database))
    files = {**draw_all(result, out), **draw_loop(result["views"], out)}
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


def archive_and_analyze(bootstrap: str, workdir: Path, idle_s: float = 2.0) -> dict[str, list[Path]]:
    """Archive everything on the broker into chdb:///<workdir>/clickhouse, then write <workdir>/report/."""
    from coevolve.services.archive.archiver import Archiver
    from coevolve.services.archive.config import ArchiverConfig
    from coevolve.services.clickhouse.client import connect
    from coevolve.services.clickhouse.urls import redact_url

    cfg = ArchiverConfig(kafka_bootstrap=bootstrap, workdir=workdir, idle_exit_seconds=idle_s, batch_seconds=0.5)
    client = connect(cfg.url, cfg.database)
    try:
        stored = Archiver(cfg, client).run()
        text, files = run_analyze(client, workdir / "report", cfg.database)
    finally:
        client.close()
    print(f"archived {stored} events into {redact_url(cfg.url)}")
    print(f"report: {sum(len(f) for f in files.values())} plots in {workdir / 'report'} (index.html)")
    return files
