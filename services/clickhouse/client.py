"""Open the archive: chDB in-process (`chdb:///dir`) or a ClickHouse server URL, same client API.

chDB lets one process hold a data directory at a time, and one directory per process: the archiver
owns the directory while it runs; `analyze` and `replay` open it after the archiver stops.
"""
from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import clickhouse_connect
from clickhouse_connect.driver.exceptions import ClickHouseError

from coevolve.services.clickhouse.migrations import migrate
from coevolve.services.clickhouse.urls import redact_url


class ArchiveError(ValueError):
    """The archive cannot be opened or is not a CoEvolve archive."""


def chdb_url(workdir: Path | str) -> str:
    """The embedded archive's URL for a work directory."""
    return f"chdb://{Path(workdir).resolve() / 'clickhouse'}"


def connect(url: str, database: str = "coevolve", create: bool = True):
    """A clickhouse-connect client for `url`, with the archive's migrations applied when `create`."""
    shown = redact_url(url)
    if url.startswith("chdb:") and not url.startswith(("chdb:///", "chdb://memory")):
        raise ArchiveError(f"{shown!r}: use chdb:///absolute/path or chdb://memory")
    if url.startswith("chdb:///"):
        path = Path(url.removeprefix("chdb://").partition("?")[0])  # chDB ignores query arguments
        if not create and not path.is_dir():
            raise ArchiveError(f"{shown}: no such archive directory; archive a run first (`coevolve archiver`)")
        path.mkdir(parents=True, exist_ok=True)
    try:
        client = clickhouse_connect.get_client(dsn=url)
    except ClickHouseError as exc:
        hint = " (another process, e.g. a running archiver, may hold this chDB directory)" \
            if url.startswith("chdb:") else ""
        raise ArchiveError(f"cannot open the archive at {shown}: {exc}{hint}") from exc
    if create:
        migrate(client, database)
    elif database not in {r[0] for r in client.query("SHOW DATABASES").result_rows}:
        client.close()
        raise ArchiveError(f"{shown} holds no `{database}` database; archive a run first (`coevolve archiver`)")
    return client


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector for a block that builds many short-lived, acyclic objects
    (a batch of rows, a result set): its collections would otherwise cost about half the time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
