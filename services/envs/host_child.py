"""The tool host's own process (`host.py` starts it): it sets its limits, then answers one request at a
time over its pipes, in JSON, until the calling process closes them."""
from __future__ import annotations

import json
import pickle
import resource
import signal
import sys
from multiprocessing.connection import Connection

from coevolve.services.envs.tools import InvalidTask, LocalWorkspace

FILE_LIMIT_MB = 64  # the largest file a call may write (RLIMIT_FSIZE); past it the write fails


def serve(recv: Connection, send: Connection) -> None:
    """The host's loop: one request at a time, until the client closes its end."""
    spaces: dict[int, LocalWorkspace] = {}
    while True:
        try:
            op, *args = pickle.loads(recv.recv_bytes())
        except EOFError:
            return
        try:
            if op == "open":
                spaces[args[0]] = LocalWorkspace(args[1])
                reply: tuple = ("ok", None)
            elif op == "run":
                reply = ("ok", spaces[args[0]].run(args[1]))
            elif op == "differences":
                reply = ("ok", spaces[args[0]].state_differences(spaces[args[1]]))
            elif op == "close":
                for ws in args[0]:
                    spaces.pop(ws, None)
                reply = ("ok", None)
            elif op == "ready":
                reply = ("ok", None)
            else:
                reply = ("error", f"unknown request {op!r}")
        except InvalidTask as exc:
            reply = ("invalid", str(exc))
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        send.send_bytes(json.dumps(reply).encode())


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit(f"usage: {sys.executable} -m {__name__} READ_FD WRITE_FD MEMORY_MB (started by ToolHost)")
    read_fd, write_fd, memory_mb = map(int, argv)
    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file limit fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT_MB << 20, FILE_LIMIT_MB << 20))
    serve(Connection(read_fd, writable=False), Connection(write_fd, readable=False))


if __name__ == "__main__":
    main(sys.argv[1:])
