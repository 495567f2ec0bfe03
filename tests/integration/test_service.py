"""The service skeleton: health and metrics served while it runs, work stored before offsets are
committed, a graceful stop on SIGTERM that still finishes."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest

from coevolve.services.runtime.service import Service

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class QueueConfig:
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0


class QueueService(Service):
    """Moves batches from `inbox` to `stored`, committing after each; `fail_on` makes a store fail."""

    name = "queue"

    def __init__(self, batches, fail_on=None, cfg=QueueConfig()):
        super().__init__(cfg)
        self.inbox, self.fail_on = list(batches), fail_on
        self.stored, self.committed, self.finished = [], [], False

    def poll(self) -> None:
        self.beat()
        if not self.inbox:
            time.sleep(0.01)
            return
        batch = self.inbox.pop(0)

        def store():
            if batch == self.fail_on:
                raise RuntimeError("store failed")
            self.stored.append(batch)

        self.settle(store, lambda: self.committed.append(batch), len(batch))

    def details(self) -> dict:
        return {"stored": len(self.stored)}

    def finish(self) -> None:
        self.finished = True


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_serves_health_and_metrics_while_running_and_returns_what_it_committed():
    service = QueueService([[1, 2], [3]])
    thread = threading.Thread(target=lambda: setattr(service, "result", service.run()))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while (service.server is None or service.inbox) and time.monotonic() < deadline:
            time.sleep(0.01)
        base = f"http://127.0.0.1:{service.server.server_address[1]}"
        code, body = _get(f"{base}/healthz")
        assert code == 200 and json.loads(body)["status"] == "ok" and json.loads(body)["stored"] == 2
        code, body = _get(f"{base}/metrics")
        assert code == 200 and "queue_events_total 3.0" in body.decode()
        assert _get(f"{base}/nothing")[0] == 404
    finally:
        service.stop()
        thread.join(10)
    assert service.result == 3 and service.committed == [[1, 2], [3]] and service.finished


def test_a_failed_store_commits_nothing_and_still_finishes():
    service = QueueService([[1], [2], [3]], fail_on=[2], cfg=QueueConfig(metrics_port=-1))
    with pytest.raises(RuntimeError, match="store failed"):
        service.run()
    assert service.stored == [[1]] and service.committed == [[1]] and service.committed_events == 1
    assert service.finished and service.server is None


def test_health_turns_unhealthy_when_the_loop_stops_beating():
    service = QueueService([])
    assert service.health()[0]
    service.last_beat -= service.stale_s + 1
    ok, details = service.health()
    assert not ok and details["seconds_since_poll"] > service.stale_s


def test_sigterm_stops_the_loop_and_runs_finish():
    script = textwrap.dedent("""
        import sys, time
        from coevolve.services.runtime.service import Service

        class Idle(Service):
            name = "idle"
            def start(self):
                print("started", flush=True)
            def poll(self):
                self.beat()
                time.sleep(0.01)
            def finish(self):
                print("finished", flush=True)

        class Cfg:
            metrics_port = -1

        sys.exit(Idle(Cfg()).serve_until_signalled())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.strip() == "finished"
