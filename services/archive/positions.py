"""The consumer groups' committed positions, recorded beside the log (`log_positions`) as they change.

A broker that keeps memory only loses its groups' positions with it; restored from these
(`restore.py`), each service goes on from where it had committed, give or take the last `positions_s`:
a group that committed after the last record re-reads from its previous commit, which every service
absorbs as it absorbs its own restart (it reads again from its last commit, and what it republishes
carries the ids it had).
"""
from __future__ import annotations

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.runtime.log import get_logger

log = get_logger("archiver")
COLUMNS = ["log_id", "group_id", "topic", "partition", "offset"]


class PositionRecorder:
    """Reads every group's committed offsets at most every `every_s`; hands back the ones that changed."""

    def __init__(self, bootstrap: str, log_id: str, every_s: float, security: KafkaSecurity | None = None):
        self.bootstrap, self.log_id, self.every_s = bootstrap, log_id, every_s
        self.security = security or KafkaSecurity.from_environment()
        self.admin: KafkaAdminClient | None = None
        self.known: dict[tuple[str, str, int], int] = {}
        self.read_at = 0.0

    def due(self, now: float) -> bool:
        return now - self.read_at >= self.every_s

    def changed(self, now: float) -> list[list]:
        """Rows for the positions that moved since the last read; none when the broker does not answer
        (the previous positions stand, and the next read tries again)."""
        self.read_at = now
        try:
            if self.admin is None:
                self.admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="coevolve-archiver-positions",
                                              request_timeout_ms=5000, **self.security.kafka_python_options())
            groups = sorted(g["group_id"] for g in self.admin.list_groups())
            found = {(g, tp.topic, tp.partition): meta.offset
                     for g in groups for tp, meta in self.admin.list_group_offsets(g).get(g, {}).items()
                     if meta.offset >= 0}
        except (KafkaError, OSError) as exc:
            log.warning("archiver.positions_unread", error=type(exc).__name__, detail=str(exc)[:200])
            return []
        rows = [[self.log_id, g, topic, partition, offset] for (g, topic, partition), offset in sorted(found.items())
                if self.known.get((g, topic, partition)) != offset]
        self.known.update(found)
        return rows

    def close(self) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None


def record(client, database: str, rows: list[list]) -> None:
    if rows:
        client.insert(f"{database}.log_positions", rows, column_names=COLUMNS)
