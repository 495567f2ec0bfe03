"""`coevolve replay --against-run RUN`: what one threshold set would have changed in a run as it happened.

The run's signals are replayed from the archive under the set and matched with its live signals by
(kind, step, subject). The live signals the set would not raise are then followed down the lineage the
archive keeps: an exploration is lost when every signal it explored is; a synthesized task is lost when
every exploration it came from is (or, without explorations, every signal); a signal whose subject is a
lost task is lost with it (the task would not have been in the pool), and so on until nothing more is
lost. The steps that
trained on a lost task are named. This is accounting over the lineage, not a rerun: after its first
change the run would have gone on differently (another policy, other signals), which no log can tell;
and the signals the set would add led to no exploration in this run.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coevolve.services.clickhouse.sql import literal
from coevolve.streams.replay.engine_sql import materialized
from coevolve.streams.replay.sql_lines import python_signals, raise_attempts, raised_rows
from coevolve.streams.replay.sql_stages import archive_source
from coevolve.streams.rules import KINDS, Thresholds


@dataclass
class LostTask:
    task_id: str
    verdict: str
    step: int
    cause: str  # the dropped signals it came from, or the lost task it descends from
    trained_at: list[int]


@dataclass
class Counterfactual:
    run_id: str
    thresholds: dict
    live_thresholds: list[dict]
    signals: dict[str, dict[str, int]]  # kind -> live, kept, dropped, added
    dropped: list[tuple[str, int, str]]
    added: list[tuple[str, int, str]]
    lost_by_descent: int  # live signals on a lost task, beyond the dropped ones
    explorations: tuple[int, int]  # lost, of all the run's
    validated: tuple[int, int]
    trained_on: tuple[int, int]
    trained_steps: int  # (task, step) draws that trained on a lost task
    tasks: list[LostTask] = field(default_factory=list)


def _query(client, sql: str) -> list[tuple]:
    return client.query(sql).result_rows


def replayed_keys(client, db: str, run_id: str, th: Thresholds) -> set[tuple[str, int, str]]:
    """(kind, step, subject) of every signal the run's log raises under `th`."""
    with materialized(client, archive_source(db, run_id), th, slim=True) as t:
        raise_attempts(client, t, th, t["raised"])
        return {(s.kind, s.step, s.subject) for s in python_signals(client, t, th, raised_rows(client, t["raised"]))}


def against_run(client, db: str, run_id: str, chosen: Callable[[Thresholds], Thresholds]) -> Counterfactual:
    """Compare the run's live signals with those of the set `chosen` makes of the run's own thresholds
    (the defaults where the run raised none, or under several sets), and follow the lost ones."""
    run = literal(run_id)
    if not _query(client, f"SELECT 1 FROM {db}.trajectories WHERE run_id = {run} LIMIT 1"):
        runs = [r[0] for r in _query(client, f"SELECT DISTINCT run_id FROM {db}.trajectories ORDER BY run_id LIMIT 20")]
        raise ValueError(f"run {run_id!r} has no trajectories in the archive; archived runs: "
                         f"{', '.join(runs) or 'none'}")
    live = {r[0]: (r[1], int(r[2]), r[3]) for r in _query(client, f"""
        SELECT event_id, kind, step, subject FROM {db}.signals FINAL WHERE run_id = {run}""")}
    live_th = [dict(zip(("success_threshold", "window", "rare_threshold", "pattern_length"), r)) for r in _query(
        client, f"""SELECT DISTINCT success_threshold, window, rare_threshold, pattern_length FROM {db}.signals FINAL
                    WHERE run_id = {run} ORDER BY success_threshold, window, rare_threshold, pattern_length""")]
    th = chosen(Thresholds(**live_th[0]) if len(live_th) == 1 else Thresholds())
    new = replayed_keys(client, db, run_id, th)
    old = set(live.values())
    dropped, added = sorted(old - new), sorted(new - old)
    signals = {k: {"live": sum(key[0] == k for key in old), "kept": sum(key[0] == k for key in old & new),
                   "dropped": sum(key[0] == k for key in dropped), "added": sum(key[0] == k for key in added)}
               for k in KINDS}
    explorations = {r[0]: tuple(r[1]) for r in _query(client, f"""
        SELECT event_id, if(empty(signal_ids) AND signal_id IS NOT NULL, [assumeNotNull(signal_id)], signal_ids)
        FROM {db}.explorations FINAL WHERE run_id = {run}""")}
    tasks = {r[0]: r[1:] for r in _query(client, f"""
        SELECT task_id, if(countIf(verdict = 'validated') > 0, 'validated', any(toString(verdict))), min(step),
               groupUniqArrayArray(signal_ids), groupUniqArrayArray(exploration_ids)
        FROM {db}.tasks FINAL WHERE run_id = {run} AND source = 'synthesized' GROUP BY task_id""")}
    trained = {r[0]: sorted(r[1]) for r in _query(client, f"""
        SELECT task_id, groupArrayIf(step, trained) FROM (
            SELECT task_id, step, max(score) > min(score) AS trained FROM {db}.trajectories FINAL
            WHERE run_id = {run} GROUP BY task_id, step) GROUP BY task_id""")}
    dropped_keys = set(dropped)
    lost_signals, lost_tasks = _follow(live, dropped_keys, explorations, tasks)
    validated = [t for t, (verdict, *_rest) in tasks.items() if verdict == "validated"]
    trained_on = [t for t in validated if trained.get(t)]
    return Counterfactual(
        run_id, th.as_record(), live_th, signals, dropped, added,
        lost_by_descent=len(lost_signals) - sum(key in dropped_keys for key in live.values()),
        explorations=(sum(_all_in(sigs, lost_signals) for sigs in explorations.values()), len(explorations)),
        validated=(sum(t in lost_tasks for t in validated), len(validated)),
        trained_on=(sum(t in lost_tasks for t in trained_on), len(trained_on)),
        trained_steps=sum(len(trained.get(t, [])) for t in lost_tasks if t in validated),
        tasks=[LostTask(t, tasks[t][0], int(tasks[t][1]), lost_tasks[t], trained.get(t, []))
               for t in sorted(lost_tasks, key=lambda t: (tasks[t][1], t))])


def _follow(live: dict, dropped: set, explorations: dict, tasks: dict) -> tuple[set[str], dict[str, str]]:
    """(lost live signal ids, lost task -> cause), to a fixed point."""
    lost = {sid for sid, key in live.items() if key in dropped}
    lost_tasks: dict[str, str] = {}
    while True:
        lost_explorations = {e for e, sigs in explorations.items() if _all_in(sigs, lost)}
        for task, (_verdict, _step, signal_ids, exploration_ids) in tasks.items():
            if task in lost_tasks:
                continue
            sources = [e for e in exploration_ids if e in explorations]
            if _all_in(sources, lost_explorations) if sources else _all_in(signal_ids, lost):
                lost_tasks[task] = _cause(live, [s for e in sources for s in explorations[e]] or signal_ids,
                                          lost_tasks)
        more = {sid for sid, (kind, _step, subject) in live.items() if kind != "rare" and subject in lost_tasks}
        if more <= lost:
            return lost, lost_tasks
        lost |= more


def _all_in(items, lost: set) -> bool:
    """Every one of `items` is lost (and there is one at least)."""
    return bool(items) and all(i in lost for i in items)


def _cause(live: dict, signal_ids, lost_tasks: dict) -> str:
    keys = sorted({live[s] for s in signal_ids if s in live})
    parents = sorted({k[2] for k in keys if k[2] in lost_tasks})
    if parents:
        return "descends from " + ", ".join(parents)
    return "; ".join(f"{kind} at step {step} on {subject}" for kind, step, subject in keys)


def _set_label(th: dict) -> str:
    return f"tau={th['success_threshold']:g} W={th['window']} theta={th['rare_threshold']:g} n={th['pattern_length']}"


def headline(c: Counterfactual) -> str:
    return (f"under {_set_label(c.thresholds)}: {c.trained_on[0]} of {c.trained_on[1]} trained-on tasks, "
            f"{c.validated[0]} of {c.validated[1]} validated tasks and {c.explorations[0]} of "
            f"{c.explorations[1]} explorations would not exist")


def against_text(c: Counterfactual) -> str:
    """The terminal's report: signals kept, dropped and added by kind, the headline, and the lost tasks."""
    live = "; ".join(_set_label(t) for t in c.live_thresholds) or "no live signals archived"
    lines = [f"run {c.run_id} (live: {live}) against {_set_label(c.thresholds)}",
             f"{'signals':<11}{'live':>6}{'kept':>6}{'dropped':>9}{'added':>7}"]
    lines += [f"{k:<11}{v['live']:>6}{v['kept']:>6}{v['dropped']:>9}{v['added']:>7}" for k, v in c.signals.items()]
    lines += [f"live signals lost with a lost task: {c.lost_by_descent}", headline(c),
              f"draws that trained on a lost task: {c.trained_steps}"]
    if c.tasks:
        width = max(len(t.task_id) for t in c.tasks)
        lines.append(f"{'task':<{width}}  {'verdict':<9} {'step':>4}  trained at  cause")
        lines += [f"{t.task_id:<{width}}  {t.verdict:<9} {t.step:>4}  {','.join(map(str, t.trained_at)) or '-':<10}  "
                  f"{t.cause}" for t in c.tasks]
    for sign, keys in (("-", c.dropped), ("+", c.added)):
        lines += [f"  {sign} {kind} step={step} {subject}" for kind, step, subject in keys[:20]]
        if len(keys) > 20:
            lines.append(f"  {sign} ... {len(keys) - 20} more")
    return "\n".join(lines)


def write_against_report(c: Counterfactual, out: Path) -> list[Path]:
    """against-<run>.md (the terminal's report) and against-<run>.json (everything) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / f"against-{c.run_id}.md", out / f"against-{c.run_id}.json"
    md.write_text(f"# {headline(c)}\n\n```\n{against_text(c)}\n```\n")
    js.write_text(json.dumps(asdict(c), indent=1) + "\n")
    return [md, js]
