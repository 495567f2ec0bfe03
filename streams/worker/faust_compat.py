"""Faust's quirks on this broker, worked around in one place. Written for faust-streaming 0.15.3
(aiokafka underneath) on Tansu 0.6.0; check each one after a version bump.

- `exact_highwaters`: Tansu answers ListOffsets(latest) with the last *batch*'s base offset + 1; table
  recovery reads each changelog up to that end, so a restarted worker lost the tail of its tables.
- `PRODUCER_BATCH_BYTES`: one record per batch would make those ends exact, but aiokafka then sends one
  record per partition per round trip, which stalled sends.
- `shorten_fetch_wait`: Faust creates its aiokafka consumer with fetch_max_wait_ms=1500 and no setting
  to change it; Tansu holds an empty fetch for that long even when data arrives.
- `write_under`: Faust picks a table write's changelog partition from the current event, and a batch
  of `take_events` mixes partitions.
- `confirm_writes` (tables of class `ConfirmedTable`): Faust flushes its producer before it commits
  offsets, but that flush returns once 0.1 s passes without a send, so on a loaded machine it
  committed offsets whose events' table writes were still buffered; a worker killed (or a table
  recovered in a rebalance) then lost those writes for good (a step's rare counts stayed short of its
  trajectory count: it never closed by count). The agents wait for their changelog records before
  their events are acknowledged.
- `send_confirmed`: sends through the app's producer and waits for every acknowledgement.
- `resume_in_order`: over a rebalance Faust kept handing streams what its consumer fetched, skipping
  (and acknowledging) some while the flow was suspended, until recovery sought each partition to its
  committed offset; aiokafka skips that seek where nothing was committed. A partition then resumed out
  of order or with a hole: the first events where a killed worker never committed went unprocessed,
  and a fetch handed out across the seek raised Faust's "read offset" past the committed one, so the
  events fetched again were dropped (steps never counted whole; the gap stopped commits too). Now,
  from a rebalance's start, the streams get nothing until the seek, which positions every source
  partition at once (uncommitted ones at their first offset); then each resumes at that message.
- `store_batch`: `take_events` acknowledges a batch's events in a `finally`, so when an agent raised
  while storing them Faust restarted the agent with the batch acknowledged and its results never
  stored. A batch that cannot be stored now ends the process before anything acknowledges it; the
  supervisor (Kubernetes, `coevolve run`) starts it again from the committed offsets.
- `TrackedMemoryStore` (store `TRACKED_MEMORY`): Faust's memory store reports no persisted offset, so
  every rebalance re-reads a kept partition's changelog from the start and applies it over the live
  table. A batch whose changelog records were still in flight then had its newer values overwritten
  by older ones (a kept worker's step counts fell short after another worker restarted, and those
  steps never closed by count). This store remembers the changelog offset its contents reflect, from
  recovery and from confirmed writes (Faust's `set_persisted_offset` hook, as for RocksDB), so
  recovery reads only what came after.
"""
from __future__ import annotations

import asyncio
import os
import sys
import weakref

import faust
from faust.stores import STORES
from faust.stores.memory import Store as MemoryStore
from faust.streams import _current_event  # the event whose partition a table write goes to

from coevolve.services.kafka.offsets import true_end_offsets
from coevolve.services.runtime.log import get_logger

log = get_logger("streams")
PRODUCER_BATCH_BYTES = 256 * 1024
EXIT_UNSTORED = 75  # EX_TEMPFAIL: start the worker again
TRACKED_MEMORY = "trackedmemory://"


def exact_highwaters(app: faust.App, bootstrap: str) -> None:
    """Make the app's consumer report probed true end offsets (`kafka.offsets.true_end_offsets`)."""
    consumer = app.consumer
    reported_highwaters = consumer.highwaters

    async def highwaters(*tps):
        return await asyncio.to_thread(true_end_offsets, bootstrap, await reported_highwaters(*tps))

    consumer.highwaters = highwaters


class _ResumeGate:
    """Which source partitions may reach the streams: none from a rebalance's start until its seek,
    then each once its message at the seek target (the committed or first offset) comes."""

    def __init__(self, tables):
        self.tables = tables  # the app's table manager: table recovery reads the changelogs meanwhile
        self.changelogs: frozenset = frozenset()
        self.held = True
        self.targets: dict = {}  # TP -> offset its stream resumes at

    def is_changelog(self, topic: str) -> bool:
        if not self.changelogs:  # the tables register theirs as the app starts
            self.changelogs = frozenset(self.tables.changelog_topics)
        return topic in self.changelogs

    def passes(self, tp, offset: int) -> bool:
        if self.is_changelog(tp.topic):
            return True
        if self.held:
            return False
        target = self.targets.get(tp)
        if target is None or offset <= target:
            self.targets.pop(tp, None)
            return True
        return False


def resume_in_order(app: faust.App) -> None:
    """Hold the app's source partitions from each rebalance's start until its seek to committed
    offsets (uncommitted ones to their first), then resume each at its seek target."""
    consumer = app.consumer
    gate = _ResumeGate(app.tables)
    on_rebalance_start, seek_to_committed = app.on_rebalance_start, consumer.seek_to_committed
    getmany = consumer.getmany

    def hold() -> None:
        gate.held = True
        on_rebalance_start()

    async def seek() -> dict:
        committed = await seek_to_committed()
        sources = [tp for tp in committed if not gate.is_changelog(tp.topic)]
        first = await consumer.earliest_offsets(*sources) if sources else {}
        targets = {tp: max(committed[tp] or 0, first.get(tp) or 0) for tp in sources}
        if targets:  # a seek that takes effect at once: a fetch still in flight is discarded
            await consumer.seek_wait(targets)
        gate.targets, gate.held = targets, False
        return committed

    async def gated(timeout: float):
        async for tp, message in getmany(timeout=timeout):
            if gate.passes(tp, message.offset):
                yield tp, message

    app.on_rebalance_start, consumer.seek_to_committed, consumer.getmany = hold, seek, gated


def shorten_fetch_wait(app: faust.App, ms: int) -> None:
    """Set the running aiokafka fetcher's fetch_max_wait_ms (the consumer exists only once started)."""
    consumer = getattr(getattr(app.consumer, "_thread", None), "_consumer", None)
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is not None and getattr(fetcher, "_fetch_max_wait_ms", ms) != ms:
        fetcher._fetch_max_wait_ms = ms


class TrackedMemoryStore(MemoryStore):
    """The memory store, plus the last changelog offset per partition that its contents reflect."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.offsets: dict = {}  # changelog TP -> last offset applied or confirmed

    def set_persisted_offset(self, tp, offset: int) -> None:
        """Faust's hook for each changelog record the broker confirmed."""
        self.offsets[tp] = max(offset, self.offsets.get(tp, -1))

    def apply_changelog_batch(self, batch, to_key, to_value) -> None:
        """Apply the records after those the store reflects (Faust's recovery re-reads the last one)."""
        fresh = [e for e in batch if e.message.offset > self.offsets.get(e.message.tp, -1)]
        super().apply_changelog_batch(fresh, to_key, to_value)
        for event in fresh:
            self.set_persisted_offset(event.message.tp, event.message.offset)

    def persisted_offset(self, tp):
        return self.offsets.get(tp)

    async def on_recovery_completed(self, active_tps, standby_tps) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        kept = set(active_tps) | set(standby_tps)
        for tp in [tp for tp in self.offsets if tp not in kept]:  # read whole if it comes back
            del self.offsets[tp]


STORES.aliases.setdefault(TRACKED_MEMORY.split(":")[0], f"{__name__}:TrackedMemoryStore")


class ConfirmedTable(faust.Table):
    """A table that keeps the futures of its changelog records until `confirm_writes` awaits them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unconfirmed: list[asyncio.Future] = []

    def send_changelog(self, *args, **kwargs):
        fut = super().send_changelog(*args, **kwargs)
        self.unconfirmed.append(fut)
        return fut


def write_under(table, writes: dict) -> None:
    """Write each key once, as if under its (event, value) pair's event, so its changelog record goes
    to that event's partition."""
    for key, (ev, value) in writes.items():
        token = _current_event.set(weakref.ref(ev))
        try:
            table[key] = value
        finally:
            _current_event.reset(token)


async def confirm_writes(*tables: ConfirmedTable) -> None:
    """Wait until the broker has confirmed the tables' changelog records written so far: a batch's
    events are then acknowledged (their offsets committable) only once their state is stored."""
    futures = []
    for table in tables:
        futures += table.unconfirmed
        table.unconfirmed = []
    if futures:
        await asyncio.gather(*futures)


async def send_confirmed(app: faust.App, sends: list) -> None:
    """Send (topic, key, value, partition) tuples, then wait until the broker has confirmed every one."""
    producer = app.producer
    futures = [await producer.send(topic.get_topic_name(), key, value, part, None, None)
               for topic, key, value, part in sends]
    if futures:
        await asyncio.gather(*futures)


async def store_batch(app: faust.App, agent: str, sends: list, *writes: tuple) -> None:
    """Store a batch's results: its sends, then each (table, writes) pair, each confirmed by the
    broker. On any failure, or a cancel (a stop) half-way, the process ends at once (`EXIT_UNSTORED`),
    its events unacknowledged."""
    try:
        await send_confirmed(app, sends)
        for table, table_writes in writes:
            write_under(table, table_writes)
        await confirm_writes(*(table for table, _ in writes))
    except (Exception, asyncio.CancelledError) as exc:
        log.error("streams.batch.unstored", agent=agent, error=repr(exc),
                  hint="the worker exits without acknowledging the batch; restarted, it reads the batch "
                       "again from the committed offsets. Check the broker if this repeats.")
        sys.stderr.flush()
        os._exit(EXIT_UNSTORED)
