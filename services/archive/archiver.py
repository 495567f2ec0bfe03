"""`coevolve archiver`: a consumer group that stores every topic in ClickHouse (a runtime.Service).

Each poll's events are added to a batch; a full (or old enough) batch is inserted, table by table, and
only then are the consumer offsets committed. A crash between insert and commit makes the group
re-deliver the batch, whose rows collapse into the stored ones by `event_id` (ReplacingMergeTree), so
nothing is lost and nothing counts twice.

With `log_id` every polled record is also kept as it was sent (bytes, key, headers, timestamp) in the
`log` table, undecodable ones included, and the consumer groups' committed positions in
`log_positions` (`positions.py`): the log's durable copy, which `restore.py` puts back on an empty broker.

An event that decodes but has no archive table (a schema added to schemas/ without a mapping in
rows.py and a migration) is sent to the dead-letter topic with the reason, in the same batch: its
offset is committed only once the dead letter is confirmed, so it is neither dropped nor a crash.
"""
from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram
from tqdm import tqdm

from coevolve.services.archive.config import ArchiverConfig
from coevolve.services.archive import positions
from coevolve.services.archive.rows import COLUMNS, LOG, archivable, log_row, rows_for
from coevolve.services.clickhouse.client import connect, gc_paused
from coevolve.services.clickhouse.urls import redact_url
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import CATALOG
from coevolve.services.runtime.log import get_logger
from coevolve.services.runtime.service import Service

log = get_logger("archiver")


class RowBatch:
    """Polled events as rows per table, with when the first of them came."""

    def __init__(self) -> None:
        self.rows: dict[str, list[list]] = {}
        self.events = 0
        self.started = 0.0

    def add(self, name: str, event: dict, partition: int, offset: int) -> None:
        self.count()
        for table, rows in rows_for(name, event, partition, offset).items():
            self.rows.setdefault(table, []).extend(rows)

    def keep(self, log_id: str, records: list) -> None:
        """Keep the polled records as sent (undecodable ones too), in the `log` table."""
        if records:
            if not self.pending:
                self.started = time.monotonic()
            self.rows.setdefault("log", []).extend(log_row(log_id, r) for r in records)

    def count(self) -> None:
        """Count one polled event (stored or dead-lettered): its offset is committed with the batch."""
        if not self.pending:
            self.started = time.monotonic()
        self.events += 1

    @property
    def pending(self) -> bool:
        return bool(self.events or self.rows)


class Archiver(Service):
    """Consume, batch, insert, then commit. `run()` blocks; `stop()` ends it after storing the batch."""

    name = "archiver"

    def __init__(self, config: ArchiverConfig, client=None, schemas=None):
        super().__init__(config)
        self.schemas = schemas  # the SchemaRegistry to decode with (default: schemas/)
        self.client = client if client is not None else connect(config.url, config.database)
        self._owns_client = client is None
        self.m_rows = Counter("archiver_rows", "Rows inserted, by table.", ["table"], registry=self.registry)
        self.m_batch = Histogram("archiver_batch_seconds", "Insert time of one batch.", registry=self.registry)
        self.m_dead = Gauge("archiver_dead_lettered", "Messages sent to the dead-letter topic: undecodable, "
                            "or an event with no archive table.", registry=self.registry)
        self.consumer = self.deadletters = self.bar = self.positions = None
        self.batch = RowBatch()
        self.last_event = time.monotonic()

    @property
    def stored_events(self) -> int:
        return self.committed_events

    def details(self) -> dict:
        return {"stored_events": self.stored_events}

    def store(self, batch: RowBatch) -> None:
        """Insert the batch's rows, every table; raise if any insert fails (offsets stay uncommitted)."""
        started = time.monotonic()
        db = self.cfg.database
        for table, rows in batch.rows.items():
            columns = [list(c) for c in zip(*rows)]  # column-oriented inserts are about 40% faster
            self.client.insert(f"{db}.{table}", columns, column_names=LOG if table == "log" else COLUMNS[table],
                               column_oriented=True)
            self.m_rows.labels(table).inc(len(rows))
        self.m_batch.observe(time.monotonic() - started)
        log.info("archiver.stored", events=batch.events, seconds=round(time.monotonic() - started, 3),
                 tables={t: len(r) for t, r in batch.rows.items()})

    def commit(self, consumer) -> bool:
        """Commit the offsets of everything polled so far (all of it stored by now)."""
        return consumer.commit()

    def start(self) -> None:
        cfg = self.cfg
        self.deadletters = EventProducer(cfg.kafka_bootstrap, client_id="coevolve-archiver", service="archiver")
        self.consumer = EventConsumer(cfg.kafka_bootstrap, cfg.topic_list, group_id=cfg.group(self.name),
                                      service="archiver", deadletters=self.deadletters, registry=self.schemas)
        if cfg.log_id:
            self.positions = positions.PositionRecorder(cfg.kafka_bootstrap, cfg.log_id, cfg.positions_s)
        log.info("archiver.started", bootstrap=cfg.kafka_bootstrap, archive=redact_url(cfg.url), topics=cfg.topic_list,
                 log_id=cfg.log_id or None)
        self.bar = tqdm(desc="archive", unit="event", disable=None, leave=False)
        self.last_event = time.monotonic()

    def poll(self) -> None:
        """Poll once; store and commit the batch when it is full or old enough; stop when idle long enough."""
        cfg, batch = self.cfg, self.batch
        records = [] if cfg.log_id else None
        items = self.consumer.poll(0.2, cfg.poll_records, records)
        self.beat()
        with gc_paused():
            batch.keep(cfg.log_id, records)
            for item in items:
                if archivable(item.name):
                    batch.add(item.name, item.event, item.partition, item.offset)
                else:
                    self.consumer.reject(item, "unarchivable", f"no archive table for {item.name} events; add "
                                         "its mapping to services/archive/rows.py and a migration")
                    batch.count()
        if items or not self.consumer.assigned():
            self.last_event = self.last_beat  # idle time counts from the group join on
        if batch.pending and (batch.events >= cfg.batch_size or self.last_beat - batch.started >= cfg.batch_seconds):
            self._flush()
        if self.positions is not None and self.positions.due(self.last_beat):
            positions.record(self.client, cfg.database, self.positions.changed(self.last_beat))
        self.m_dead.set(self.consumer.dead_lettered)
        idle = self.last_beat - self.last_event
        if cfg.idle_exit_seconds and not self.batch.pending and idle >= cfg.idle_exit_seconds:
            self.stop()

    def loop(self) -> None:
        super().loop()
        if self.batch.pending:
            self._flush()

    def finish(self) -> None:
        for closable in (self.bar, self.consumer, self.deadletters, self.positions):
            if closable is not None:
                closable.close()
        if self._owns_client:
            self.client.close()

    def _flush(self) -> None:
        batch, self.batch = self.batch, RowBatch()

        def store() -> None:
            with gc_paused():
                self.store(batch)

        self.settle(store, lambda: self.commit(self.consumer), batch.events)
        self.bar.update(batch.events)
