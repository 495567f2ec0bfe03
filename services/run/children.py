"""The run's service processes: start with their environment, watch their health, stop in order."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from coevolve.services.runtime.ports import free_port


class ChildFailed(RuntimeError):
    """A service process exited when it should not have; the message names its log."""


def coevolve_command() -> str:
    return str(Path(sys.executable).with_name("coevolve"))


@dataclass
class Child:
    """One `coevolve <service>` process, its log file and its health endpoint."""

    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    def start(self) -> "Child":
        cmd = [coevolve_command(), "--log-level", "info", *self.args, "--metrics-port", str(self.port)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            # A session of its own: a Ctrl-C at the terminal reaches the run, which stops children in order.
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **self.env})
        return self

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def health(self) -> dict | None:
        """The /healthz JSON when the service answers healthy, else None."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5.0) as response:
                return json.loads(response.read() or b"{}")
        except (OSError, ValueError):
            return None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def failure(self) -> ChildFailed:
        return ChildFailed(f"{self.name} exited with code {self.exit_code}; its log is {self.log_path}:\n"
                           f"{self.log_tail()}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; return the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.exit_code
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def wait_healthy(children: list[Child], timeout_s: float) -> None:
    """Block until every child answers /healthz; raise ChildFailed when one exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    waiting = list(children)
    while waiting:
        for child in list(waiting):
            if child.exit_code is not None:
                raise child.failure()
            state = child.health()
            if state is not None and state.get("ready", True):
                waiting.remove(child)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(c.name for c in waiting)
            raise ChildFailed(f"{names} not healthy after {timeout_s:.0f} s (run.start_timeout_s); logs in "
                              f"{waiting[0].log_path.parent}")
        time.sleep(0.5)
