"""What the e2e tests share: the `coevolve` command and a run's events read back from the broker."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.topics import CATALOG
from coevolve.services.runtime.processes import tree

EXE = str(Path(sys.executable).with_name("coevolve"))


def events(bootstrap: str, run_id: str, dedupe: bool = True) -> dict[str, list[dict]]:
    """The run's events on the broker, by event name (each event id once unless `dedupe` is False)."""
    consumer = EventConsumer(bootstrap, list(CATALOG), service="test")
    try:
        out: dict[str, list[dict]] = {}
        for item in consumer.drain(idle_s=2.0):
            if item.event.get("run_id") in (run_id, None) or item.name == "TaskChecked":
                out.setdefault(item.name, []).append(item.event)
    finally:
        consumer.close()
    if dedupe:
        out = {name: list({e["event_id"]: e for e in found}.values()) for name, found in out.items()}
    return out


def trained_steps(found: dict[str, list[dict]]) -> list[int]:
    """The steps whose `StepCompleted` reports a GRPO update (a loss)."""
    return sorted(e["step"] for e in found["StepCompleted"] if e["loss"] is not None)


def _listening_inodes() -> dict[str, tuple[str, int]]:
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
    inodes, found = _listening_inodes(), set()
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
