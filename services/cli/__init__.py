"""The `coevolve` command: one Typer app (`common.py`), a subcommand per service or tool: the
long-running services (`services.py`), whole runs (`runs.py`), and the tools over the log and the
archive (`logtools.py`)."""
from __future__ import annotations

import sys

# Each module registers its commands; `coevolve --help` lists them in this order.
from coevolve.services.cli import runs
from coevolve.services.cli import services
from coevolve.services.cli import logtools
from coevolve.services.cli.common import app


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
