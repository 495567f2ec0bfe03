"""The archiver's settings: `ARCHIVER_<FIELD>`, then `<FIELD>`, or `archiver.<field>` in a preset."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coevolve.services.kafka.topics import CATALOG
from coevolve.services.runtime.config import ConfigError, ConsumerConfig, doc


@dataclass(frozen=True)
class ArchiverConfig(ConsumerConfig):
    """Where the archive is and how events are batched into it."""

    clickhouse_url: str = doc("", "Archive URL: chdb:///abs/dir (embedded) or a server's http(s):// URL; "
                                  "empty: chdb:///<workdir>/clickhouse.")
    workdir: Path = doc(Path(".coevolve"), "Work directory holding the embedded archive.")
    database: str = doc("coevolve", "ClickHouse database of the archive tables.")
    topics: str = doc(",".join(CATALOG), "Comma-separated topics to archive.")
    batch_size: int = doc(20000, "Events per insert; a batch is stored when this full or batch_seconds old.")
    batch_seconds: float = doc(1.0, "Longest time a polled event waits before its batch is stored.")
    log_id: str = doc("", "Also keep every record's bytes, and the consumer groups' committed positions, "
                          "under this name (the `log` tables), so `coevolve archive restore` can put the topics "
                          "back on an empty broker; `coevolve run` names its embedded broker's log after the run. "
                          "Empty: not kept.")
    positions_s: float = doc(2.0, "With log_id: how often the consumer groups' committed positions are recorded.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size < 1 or self.batch_seconds <= 0 or self.positions_s <= 0:
            raise ConfigError("batch_size must be >= 1, and batch_seconds and positions_s > 0")
        unknown = [t for t in self.topic_list if t not in CATALOG]
        if unknown:
            raise ConfigError(f"unknown topics {unknown}; choose from {sorted(CATALOG)}")

    @property
    def topic_list(self) -> list[str]:
        return [t.strip() for t in self.topics.split(",") if t.strip()]

    @property
    def url(self) -> str:
        from coevolve.services.clickhouse.client import chdb_url

        return self.clickhouse_url or chdb_url(self.workdir)
