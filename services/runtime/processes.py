"""Child processes that end with the process that started them, the children of a process, and killing a
process with everything it started."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Iterator

WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
               "os.getppid() != int(sys.argv[1]) and sys.exit(1); os.execv(sys.argv[2], sys.argv[2:])")
"""`python -c WITH_PARENT <parent pid> <program> <args...>` runs the program with PR_SET_PDEATHSIG (kept
across exec) set to SIGTERM: it is told to stop once the process that started it is gone, even killed."""


def _stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command) of every process (Linux /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        yield int(stat.parent.name), fields


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return [child for child, fields in _stats() if int(fields[1]) == pid]


def _started(pid: int) -> str | None:
    """The process's start time (its identity across pid reuse), or None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def tree(pid: int) -> dict[int, str]:
    """Every live process below `pid`, across sessions (torchrun's ranks, model servers): pid -> start time."""
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        frontier = [c for p in frontier for c in children(p) if c not in found]
        found.update((c, s) for c in frontier if (s := _started(c)) is not None)
    return found


def session(sid: int, leader_gone: bool = False) -> dict[int, str]:
    """Every live process of session `sid` but its leader (a child started in a session of its own leaves
    its processes there when it exits): pid -> start time. With `leader_gone` (the caller reaped the
    leader), a live process holding the pid means the pid was reused by a new session: none is ours."""
    found: dict[int, str] = {}
    for pid, fields in _stats():
        if pid == sid and leader_gone and fields[0] not in ("Z", "X"):
            return {}
        if int(fields[3]) == sid and pid != sid and fields[0] not in ("Z", "X"):
            found[pid] = fields[19]
    return found


def kill_tree(processes: dict[int, str], timeout_s: float = 30.0) -> list[int]:
    """SIGKILL the processes of a `tree` (those still the same processes) and wait until they are gone; the
    pids still there after `timeout_s`."""
    for pid, started in processes.items():
        if _started(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    left = [p for p, s in processes.items() if _started(p) == s]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _started(p) == processes[p]]
    return left
