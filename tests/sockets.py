"""Who listens on which TCP address, read from /proc: the tests that hold processes to loopback."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from coevolve.services.runtime.processes import tree


def listening() -> dict[str, tuple[str, int]]:
    """Socket inode -> (address, port) of every listening TCP socket in this network namespace."""
    found = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            raw, port = fields[1].split(":")
            packed = b"".join(bytes.fromhex(raw[i:i + 8])[::-1] for i in range(0, len(raw), 8))
            found[fields[9]] = (socket.inet_ntop(family, packed), int(port, 16))
    return found


def listening_sockets(pid: int) -> set[tuple[str, int, str]]:
    """(address, port, command) of each TCP socket listened on by `pid` or a process below it."""
    inodes, found = listening(), set()
    for member in [pid, *tree(pid)]:
        try:
            command = Path(f"/proc/{member}/cmdline").read_bytes().split(b"\0")[:3]
            links = [os.readlink(f"/proc/{member}/fd/{fd}") for fd in os.listdir(f"/proc/{member}/fd")]
        except OSError:  # gone meanwhile
            continue
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in inodes:
                found.add((*inodes[link[8:-1]], b" ".join(command).decode(errors="replace")))
    return found
