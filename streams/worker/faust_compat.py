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
- `seek_uncommitted_to_start`: after a rebalance Faust seeks each assigned partition to its committed
  offset, and aiokafka skips the seek where none was committed. The consumer has meanwhile fetched
  (and Faust dropped, while tables recovered) from its reset position, so such a partition resumed
  where that fetch ended: a worker that took over a partition its killed owner never committed left
  its first events unprocessed (a step's counts short, or no step completed at all) and, with the
  gap, never committed it again. Those partitions now start from their first offset.
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
import weakref

import faust
from faust.stores import STORES
from faust.stores.memory import Store as MemoryStore
from faust.streams import _current_event  # the event whose partition a table write goes to

from coevolve.services.kafka.offsets import true_end_offsets

PRODUCER_BATCH_BYTES = 256 * 1024
TRACKED_MEMORY = "trackedmemory://"


def exact_highwaters(app: faust.App, bootstrap: str) -> None:
    """Make the app's consumer report probed true end offsets (`kafka.offsets.true_end_offsets`)."""
    consumer = app.consumer
    reported_highwaters = consumer.highwaters

    async def highwaters(*tps):
        return await asyncio.to_thread(true_end_offsets, bootstrap, await reported_highwaters(*tps))

    consumer.highwaters = highwaters


def seek_uncommitted_to_start(app: faust.App) -> None:
    """Make the seek to committed offsets send the app's source partitions with no committed offset
    back to their first offset (changelog partitions are positioned by table recovery)."""
    consumer = app.consumer
    seek_to_committed = consumer.seek_to_committed

    async def seek() -> dict:
        committed = await seek_to_committed()
        changelogs = set(app.tables.changelog_topics)
        fresh = [tp for tp, offset in committed.items() if not offset and tp.topic not in changelogs]
        if fresh:
            await consumer._thread.seek_to_beginning(*fresh)
        return committed

    consumer.seek_to_committed = seek


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
