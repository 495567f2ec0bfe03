"""The embedded broker's log survives it: the archiver keeps every record and the groups' positions
under the run's id (`archiver.log_id`), and the run puts them back on a new broker
(`services/archive/restore.py`) when it resumes, or when the broker dies under it.

A broker that dies mid-run: the archiver is stopped first (SIGTERM: it stores the batch it polled), the
other services are killed, a new broker starts at the same address, the run's log is restored, and
every service starts again: the learner with `--resume` (its checkpoint and step journal), the explorer,
validator and archiver at their recorded positions, the signal worker from the start of the restored
topics (its tables' changelogs were on the broker). What the broker had accepted and the archiver had
not yet stored (at most `archiver.batch_seconds` plus a poll and an insert) is lost, but for the learner's
last step, which the resumed learner sends again (`learner/loop/resume.py`), and the signals, which the
worker raises again.
"""
from __future__ import annotations

import time

from coevolve.services.archive.restore import NoSuchLog, Restored, RestoreError, restore_log
from coevolve.services.clickhouse.client import chdb_url, connect
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.topics import CATALOG
from coevolve.services.run.children import ChildFailed
from coevolve.services.run.supervise import Restart, Watch, backoff
from coevolve.services.runtime.log import get_logger

log = get_logger("run")


def restore(s) -> Restored | None:
    """Put the run's kept log on the (new, empty) embedded broker; None when the archive keeps none."""
    if not (s.workdir / "clickhouse").is_dir():
        return None
    client = connect(chdb_url(s.workdir))
    try:
        return restore_log(client, "coevolve", s.run_id, s.bootstrap, s.plan.consumer_group("archiver"),
                           [s.plan.consumer_group("streams")])
    except NoSuchLog:
        return None
    except RestoreError as exc:
        raise ChildFailed(f"the run's log cannot be put back on the broker: {exc}") from None
    finally:
        client.close()


def resume_log(s) -> None:
    """On --resume with the embedded broker: the run's topics back before any service reads them."""
    if s.broker is None or not s.resume:
        return
    done = restore(s)
    print(done.line() if done else f"the archive keeps no log of run {s.run_id}: this session starts on empty "
          "topics", flush=True)


def tend_broker(s) -> None:
    """Bring a dead embedded broker back with the run's log and every service; raise ChildFailed past the
    restart budget."""
    if s.broker is None or s.broker.process is None or s.broker.process.poll() is None:
        return
    code, sup, now = s.broker.process.returncode, s.supervisor, time.monotonic()
    history = sup.history.setdefault("broker", [])
    if backoff(sup.policy, history, now) is None:
        raise ChildFailed(f"the broker exited with code {code} and its restarts are spent (run.restart_budget="
                          f"{sup.policy.budget} within run.restart_window_s={sup.policy.window_s:g} s)")
    history.append(now)
    print(f"the broker exited with code {code}: stopping the services, starting it again with the run's log",
          flush=True)
    log.warning("run.broker_exited", exit_code=code)
    s.consumer.close()  # before the new broker is up: its reconnect would make the topics, unrestored
    s.children["archiver"].stop(timeout_s=30.0)  # it stores the batch it holds; its commit fails
    for child in s.children.values():
        child.kill()
    s.broker.process = None
    s.broker.start()
    done = restore(s)
    print(done.line() if done else "the archive keeps no log of this run: the services start on empty topics",
          flush=True)
    sup.restarts.append(Restart("broker", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "exit", code,
                                len(history), 0.0, f"restored {done.total if done else 0} records"))
    s.consumer = EventConsumer(s.bootstrap, list(CATALOG), service="run")
    for name, child in s.children.items():
        sup.due.pop(name, None)
        if child.finishes and child.exit_code == 0:
            continue
        child.restart()
        sup.watches[name] = Watch(since=time.monotonic())
