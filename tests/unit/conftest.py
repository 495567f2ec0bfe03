"""The unit tier starts no process and no broker: within it, starting either fails the test with where
the test belongs instead (tests/integration/, which starts the real ones)."""
from __future__ import annotations

import os
import subprocess

import croniter  # noqa: F401  (see below)
import matplotlib.font_manager  # noqa: F401  (see below)
import pytest

from coevolve.services.kafka.embedded import EmbeddedBroker


# croniter (under Faust) runs `file` through `platform.architecture()` when first imported: imported
# above, before the guard, so whichever unit test imports Faust first is not blamed for that process.
# matplotlib's font manager runs `fc-list` when it first builds its font cache (a fresh machine, or a
# fresh HOME): built here, so the first unit test that draws a plot is not blamed for it either.


class StartsAProcess(AssertionError):
    """A unit test tried to start a process or a broker."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise StartsAProcess(f"a unit test may not start {what}; move the test to tests/integration/")
    return refuse


@pytest.fixture(autouse=True)
def no_process(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("a process"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse("a process"))
    monkeypatch.setattr(EmbeddedBroker, "start", _refuse("a broker"))
