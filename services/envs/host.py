"""Tool calls in a process of their own, so that no call can stall or exhaust the process that makes it.

A model-written call is free to pick its arguments, and some backend functions then compute for minutes
inside one C call that no signal or thread can interrupt (`MathAPI.round_number(1, -100000000)` makes
CPython build 10**(10**8)). The bound that holds for every function is a process: each calling process
keeps a tool host for each thread that makes calls (`hosts.py`), a child interpreter holding the
instances of that thread's open workspaces, and gives every request `limit_s` seconds. The host's address space is capped at `memory_mb` (RLIMIT_AS), so an
allocation past it fails as that call's error; it may write no file past `host_child.FILE_LIMIT_MB` (RLIMIT_FSIZE;
its output goes nowhere), it gets only the environment an interpreter needs (no broker or archive
secrets), and it answers in JSON, so nothing it sends back can run code in the calling process.
(RLIMIT_NPROC is not set: it counts every task of the user, the calling service's threads included, so
it would stop the host's own threads; the tools' backends start no process.)

A request that runs past its limit, or a host that dies under it, ends the host. The call fails with no
effect, and a new host rebuilds every other open workspace by replaying the calls it logged; a workspace
whose replayed results differ from the logged ones is lost, and its episode ends with that reason. A host
found dead before a request reaches it is replaced the same way, and the request goes to the new one.
"""
from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from coevolve.services.envs.base import Task
from coevolve.services.envs.calls import Call, Rejected
from coevolve.services.envs.tools import InvalidTask
from coevolve.services.runtime.log import get_logger

log = get_logger("tool_host")

START_S = 60.0  # a new host's imports, before its first request
CHILD = "coevolve.services.envs.host_child"  # the host's own module (its limits and its loop)


class WorkspaceLost(RuntimeError):
    """The workspace's instances were in a tool host that ended, and replaying its calls did not rebuild them."""


class _HostEnded(Exception):
    """The request ran past its limit, or the host died; the host is gone."""


class _Undelivered(_HostEnded):
    """The host had ended before the request reached it: the request did nothing and may be sent again."""


@dataclass
class _Log:
    task: Task
    calls: list[tuple[Call | Rejected, str]] = field(default_factory=list)


class ToolHost:
    """The client side: one host process at a time, restarted after a stall or a death."""

    def __init__(self, limit_s: float, memory_mb: int):  # bounds checked where they are set (EpisodeLimits)
        self.limit_s, self.memory_mb = limit_s, memory_mb
        self.stopped = self.restarts = self.lost = 0
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._logs: dict[int, _Log] = {}
        self._lost: dict[int, str] = {}
        self._collected: deque[int] = deque()  # workspaces garbage-collected since the last request
        self._process: subprocess.Popen | None = None
        self._closed = False

    # Requests from workspaces; each holds the lock for one round trip (the host runs one call at a time).

    def open(self, task: Task) -> int:
        with self._lock:
            ws = next(self._ids)
            try:
                self._ask(("open", ws, task))
            except _HostEnded as exc:
                raise InvalidTask(f"loading the initial state {exc}") from None
            self._logs[ws] = _Log(task)
            return ws

    def run(self, ws: int, call: Call | Rejected) -> str:
        with self._lock:
            self._usable(ws)
            try:
                result = self._ask(("run", ws, call))
            except _HostEnded as exc:
                self.stopped += 1
                return f"Error during execution: {call.name}: the call {exc}; it was stopped and had no effect"
            self._logs[ws].calls.append((call, result))
            return result

    def differences(self, ws: int, reference: int) -> dict[str, list[str]]:
        with self._lock:
            self._usable(ws)
            self._usable(reference)
            try:
                return self._ask(("differences", ws, reference))
            except _HostEnded as exc:
                self._lost[ws] = f"comparing its state {exc}"
                self.lost += 1
                self._logs.pop(ws, None)
                raise WorkspaceLost(self._lost[ws]) from None

    def collect(self, ws: int) -> None:
        """Called when a workspace is garbage-collected: freed in the host with the next request."""
        self._collected.append(ws)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._end()

    def _usable(self, ws: int) -> None:
        if ws in self._lost:
            raise WorkspaceLost(f"the tool host restarted and this workspace could not be rebuilt: {self._lost[ws]}")

    # The host process.

    def _ask(self, request: tuple) -> Any:
        """One round trip. A host that ended before the request reached it (killed while idle: the OOM
        killer, an operator) is replaced and the request sent to the new one: only a request that was
        delivered and then stalled or died counts against its call or task. On that: end the host,
        rebuild the open workspaces, raise."""
        if self._closed:
            raise RuntimeError("the tool host is closed: its command has ended")
        for resend in (False, True):
            if self._process is not None and self._process.poll() is not None:
                self._restart(request, f"exited while idle (code {self._process.returncode})")
            if self._process is None:
                self._start()
            try:
                return self._round_trip(request, self.limit_s)
            except _Undelivered as exc:
                self._restart(request, str(exc))
                if resend:
                    raise _HostEnded(str(exc)) from None
            except _HostEnded as exc:
                self._restart(request, str(exc))
                raise

    def _restart(self, request: tuple, reason: str) -> None:
        self.restarts += 1
        call = request[2].name if request[0] == "run" else None
        log.warning("tool_host.ended", request=request[0], call=call, reason=reason, restarts=self.restarts,
                    open_workspaces=len(self._logs))
        self._end()
        self._rebuild()

    def _round_trip(self, request: tuple, limit_s: float) -> Any:
        freed = [self._collected.popleft() for _ in range(len(self._collected))]
        for ws in freed:
            self._logs.pop(ws, None)
            self._lost.pop(ws, None)
        try:
            if freed:
                self._send.send_bytes(pickle.dumps(("close", freed)))
            self._send.send_bytes(pickle.dumps(request))
        except OSError:
            raise _Undelivered("was not delivered: the tool host had exited") from None
        try:
            if freed:
                self._reply(limit_s)
            return self._reply(limit_s)
        except (OSError, EOFError):
            raise _HostEnded("ended with the tool host, which exited") from None

    def _reply(self, limit_s: float) -> Any:
        if not self._recv.poll(limit_s):
            raise _HostEnded(f"ran past its limit of {limit_s:g} s")
        try:
            kind, value = json.loads(self._recv.recv_bytes())  # JSON: the host's replies are never code
        except ValueError as exc:
            raise RuntimeError(f"the tool host sent a reply that is not JSON ({exc})") from None
        if kind == "invalid":
            raise InvalidTask(value)
        if kind == "error":
            raise RuntimeError(f"the tool host failed: {value}")
        return value

    def _start(self) -> None:
        host_r, client_w = os.pipe()
        client_r, host_w = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", CHILD, str(host_r), str(host_w), str(self.memory_mb)],
                pass_fds=(host_r, host_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=host_environment())
        finally:
            os.close(host_r)
            os.close(host_w)
        self._send, self._recv = Connection(client_w, readable=False), Connection(client_r, writable=False)
        self._reaper = weakref.finalize(self, _kill, self._process, self._send, self._recv)
        try:
            self._round_trip(("ready",), START_S)
        except _HostEnded as exc:
            self._end()
            raise RuntimeError(f"the tool host did not start ({exc}); run `{sys.executable} -m {CHILD}` "
                               "to see why, or set call_limit_s=0 to run tool calls in this process") from None

    def _end(self) -> None:
        if self._process is not None:
            self._reaper()
            self._process = None

    def _rebuild(self) -> None:
        """A new host with every open workspace replayed; one that cannot be rebuilt is lost."""
        pending = sorted(self._logs)
        while pending:
            ws = pending.pop(0)
            entry = self._logs.get(ws)
            if entry is None:  # freed by a request of this rebuild (`collect` runs on any thread)
                continue
            if self._process is None:
                self._start()
            try:
                why = self._rerun(ws, entry)
            except _HostEnded as exc:
                self._end()
                why = f"replaying its calls {exc}"
            except (InvalidTask, RuntimeError) as exc:
                why = f"replaying its calls failed: {exc}"
            if why:
                self._lost[ws] = why
                self.lost += 1
                self._logs.pop(ws, None)
                log.warning("tool_host.workspace_lost", workspace=ws, reason=why)

    def _rerun(self, ws: int, entry: _Log) -> str | None:
        self._round_trip(("open", ws, entry.task), self.limit_s)
        for call, logged in entry.calls:
            replayed = self._round_trip(("run", ws, call), self.limit_s)
            if replayed != logged:
                return f"replaying {call.name} returned {replayed[:120]!r}, not {logged[:120]!r}"
        return None


# What the host's interpreter needs of the environment; the rest (KAFKA_SASL_PASSWORD, CLICKHOUSE_URL, tokens)
# is not the business of model-written calls.
HOST_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "PYTHONPATH", "PYTHONHASHSEED",
                    "VIRTUAL_ENV")


def host_environment() -> dict[str, str]:
    return {name: os.environ[name] for name in HOST_ENVIRONMENT if name in os.environ}


def _kill(process: subprocess.Popen, *pipes: Connection) -> None:
    process.kill()
    process.wait()
    for pipe in pipes:
        pipe.close()


class HostedWorkspace:
    """A workspace whose instances live in the tool host; the same calls as `LocalWorkspace`."""

    def __init__(self, host: ToolHost, task: Task):
        self.host = host
        self.ws = host.open(task)
        weakref.finalize(self, host.collect, self.ws)

    def run(self, call: Call | Rejected) -> str:
        return self.host.run(self.ws, call)

    def state_differences(self, reference: "HostedWorkspace") -> dict[str, list[str]]:
        return self.host.differences(self.ws, reference.ws)
