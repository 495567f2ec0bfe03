"""Child processes that end with the process that started them, and the children of a process."""
from __future__ import annotations

from pathlib import Path

WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
               "os.getppid() != int(sys.argv[1]) and sys.exit(1); os.execv(sys.argv[2], sys.argv[2:])")
"""`python -c WITH_PARENT <parent pid> <program> <args...>` runs the program with PR_SET_PDEATHSIG (kept
across exec) set to SIGTERM: it is told to stop once the process that started it is gone, even killed."""


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found
