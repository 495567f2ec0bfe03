"""The run's service processes: start with their environment, watch their health, stop in order."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from coevolve.services.runtime.logfiles import rotate, rotate_open
from coevolve.services.runtime.ports import free_port
from coevolve.services.runtime.processes import kill_tree, session, tree


class ChildFailed(RuntimeError):
    """A service process exited when it should not have; the message names its log."""


def coevolve_command() -> str:
    return str(Path(sys.executable).with_name("coevolve"))


# Cursor and colour sequences, and control characters, that a progress bar leaves in a log.
TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def coevolve_program() -> list[str]:
    return [coevolve_command(), "--log-level", "info"]


@dataclass
class Child:
    """One service process, its log file and its health endpoint: `<program> <args> --metrics-port P`,
    where the program is `coevolve --log-level info` unless given."""

    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    program: list[str] = field(default_factory=coevolve_program)
    rerun_args: list[str] = field(default_factory=list)  # added when started again (the learner's --resume)
    finishes: bool = False  # exit code 0 means its work is done (the learner), not a failure

    @property
    def command(self) -> list[str]:
        return [*self.program, *self.args, "--metrics-port", str(self.port)]

    def start(self) -> "Child":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate(self.log_path)  # appended to across runs and restarts: bounded at each start
        with open(self.log_path, "ab") as out:
            # A session of its own: a Ctrl-C at the terminal reaches the run, which stops children in order.
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, env={**os.environ, **self.env})
        return self

    def bound_log(self) -> bool:
        """Rotate the log of the running process when it is past its limit (the run calls it as it tends)."""
        return rotate_open(self.log_path)

    def restart(self) -> "Child":
        """Start again, with `rerun_args` from now on, once what the last process left is gone."""
        self.kill()
        self.args = [*self.args, *(a for a in self.rerun_args if a not in self.args)]
        return self.start()

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def health(self, timeout_s: float = 5.0) -> dict | None:
        """The /healthz JSON when the service answers healthy, else None (no answer, or 503)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except (OSError, ValueError):
            return None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def last_line(self, limit: int = 300) -> str:
        """The log's last line that says something: not blank, and not the frame of a boxed message."""
        for line in reversed(self.log_tail(20).splitlines()):
            text = TERMINAL_CODES.sub("", line).strip(" \t│┃|╭╮╰╯─━")
            if any(ch.isalnum() for ch in text):
                return text[:limit]
        return ""

    def failure(self, detail: str = "") -> ChildFailed:
        return ChildFailed(f"{self.name} exited with code {self.exit_code}{detail}; its log is {self.log_path}:\n"
                           f"{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the process and everything below it, in its session or not (torchrun's ranks, a model
        server's engine), and wait until all of it is gone: a replacement never meets the old tree."""
        if self.process is None:
            return
        if self.process.poll() is None:
            below = self._below()
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it exited in between
            self.process.wait()
            self._reap(below)
        else:
            self._reap(session(self.process.pid, leader_gone=True))  # what it left (a crashed learner's ranks)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; whatever it started and left behind is killed too. The exit code."""
        if self.process is None:
            return None
        if self.process.poll() is not None:
            self.kill()  # it exited on its own: what it left in its session goes
            return self.exit_code
        below = self._below()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reap({**below, **session(self.process.pid, leader_gone=True)})
        return self.exit_code

    def _below(self) -> dict[int, str]:
        """Everything the running process started: its tree, across sessions, and its session's members."""
        return {**session(self.process.pid), **tree(self.process.pid)}

    def _reap(self, below: dict[int, str]) -> None:
        left = kill_tree(below)
        if left:
            raise ChildFailed(f"{self.name}: processes {left} it started survived SIGKILL (stuck in the kernel?); "
                              "a replacement would meet them: check them with `ps -o pid,stat,cmd -p ...`")


def wait_healthy(children: list[Child], timeout_s: float) -> None:
    """Block until every child answers /healthz (or, one that `finishes`, has finished with code 0); raise
    ChildFailed when one exits otherwise or the time runs out."""
    deadline = time.monotonic() + timeout_s
    waiting = list(children)
    while waiting:
        for child in list(waiting):
            if child.exit_code == 0 and child.finishes:  # a learner with nothing to train (steps = 0)
                waiting.remove(child)
                continue
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
