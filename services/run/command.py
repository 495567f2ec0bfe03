"""The `coevolve run` command: one session of the loop, its summary and report."""
from __future__ import annotations

import signal
import time
from pathlib import Path

from coevolve.services.envs import bfcl_data
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.topics import CATALOG
from coevolve.services.learner.config import rollout_backend
from coevolve.services.run import loop, summary as summaries
from coevolve.services.run.children import ChildFailed
from coevolve.services.run.plan import Plan
from coevolve.services.run.shape import shape_line
from coevolve.services.run.tally import Tally
from coevolve.services.runtime import log as logs


def _report(workdir: Path) -> None:
    from coevolve.services.analytics.report import run_analyze
    from coevolve.services.clickhouse.client import chdb_url, connect

    client = connect(chdb_url(workdir), create=False)
    try:
        _, files = run_analyze(client, workdir / "report")
    finally:
        client.close()
    print(f"report: {sum(len(f) for f in files.values())} plots in {workdir / 'report'} (index.html)", flush=True)


def _session(s: loop.Session, tally: Tally, phases: dict[str, float]) -> str:
    """Start, train, drain; return how the session ended."""
    printed: set[int] = set()
    clock = time.monotonic()
    try:
        loop.warm_up_policy(s)
        phases["warmup"] = time.monotonic() - clock
        clock = time.monotonic()
        loop.start(s)
        phases["start"] = time.monotonic() - clock
        clock = time.monotonic()
        loop.train(s, tally, printed)
        phases["train"] = time.monotonic() - clock
        clock = time.monotonic()
        drained = loop.drain(s, tally, printed)
        phases["drain"] = time.monotonic() - clock
        if not drained:
            print(f"the loop did not drain within run.drain_timeout_s={s.plan.run.drain_timeout_s:.0f} s; "
                  "stopping anyway (the summary counts what was published)", flush=True)
        return "completed" if drained else "drain-timeout"
    except KeyboardInterrupt:
        print("interrupted: stopping the learner at its step boundary, then the rest (Ctrl-C again kills)",
              flush=True)
        return "interrupted"
    except ChildFailed as exc:
        print(f"run failed: {exc}", flush=True)
        return "failed"


def _shutdown(s: loop.Session, phases: dict[str, float], state: str) -> str:
    """Stop the services in order and let the archiver catch up; a second Ctrl-C kills them."""
    clock = time.monotonic()
    try:
        loop.stop_all(s)
        if s.children:
            loop.settle_archive(s)
    except KeyboardInterrupt:
        for child in (s.children or {}).values():
            child.kill()
        state = "killed"
    finally:
        phases["stop"] = time.monotonic() - clock
        if s.consumer is not None:
            s.consumer.close()
    return state


def _reread(address: str, run: str, fallback: Tally) -> Tally:
    """A fresh read of every topic, so the summary counts exactly what is on the broker."""
    consumer = EventConsumer(address, list(CATALOG), service="run")
    try:
        final = Tally(run_id=run)
        for item in consumer.drain(idle_s=1.0):
            final.add(item.name, item.event)
        return final
    except KeyboardInterrupt:
        return fallback
    finally:
        consumer.close()


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run_loop(plan: Plan, workdir: Path, bootstrap: str | None = None, resume: bool = False,
             run_id: str | None = None) -> dict:
    """Run one session of the loop in `workdir`; return the summary (also in summary.json)."""
    # SIGINT and SIGTERM both stop the run in order, even where SIGINT arrives ignored (a background
    # job of a non-interactive shell inherits SIG_IGN for it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = workdir.resolve()
    run = loop.choose_run(workdir, plan, resume, run_id)
    logs.to_file(workdir / "logs" / "run.log")
    print(f"run {run} (preset {plan.preset}, {plan.run.steps} steps) in {workdir}", flush=True)
    tally, phases = Tally(run_id=run), {}
    embedded = None if bootstrap else EmbeddedBroker().start()
    try:
        address = bootstrap or embedded.bootstrap
        s = loop.Session(plan, workdir, run, resume, bootstrap=address, broker=embedded)
        state = _session(s, tally, phases)
        state = _shutdown(s, phases, state)
        final = tally if state == "killed" else _reread(address, run, tally)
    finally:
        if embedded is not None:
            embedded.stop()
    learner = plan.settings("learner")
    info = {"run_id": run, "preset": plan.preset, "planned_steps": plan.run.steps, "resumed": resume,
            "rollout": rollout_backend(learner.backend.backend, learner.ranks.world_size),
            "world_size": learner.ranks.world_size,
            "broker": bootstrap or "embedded (its log kept in the archive, restored on resume)",
            "restarts": s.restarts}
    th = summaries.thresholds(plan.sections.get("streams", {}))
    seeds = bfcl_data.seed_pool(learner.seeds.category_list, learner.seeds.seed_tasks)
    doc = summaries.build(final, info, phases, th, state, seeds)
    summaries.write(workdir / "summary.json", doc)
    print(summaries.origin_line(doc), flush=True)
    print(shape_line(doc["task_shape"]), flush=True)
    print(summaries.repair_line(doc), flush=True)
    print(f"summary: {workdir / 'summary.json'} ({state})", flush=True)
    if state != "killed" and (workdir / "clickhouse").exists():
        _report(workdir)
    return doc
