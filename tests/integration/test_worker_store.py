"""The worker's table store remembers the changelog offset its contents reflect, so a rebalance that
re-reads a kept partition's changelog from the start cannot put older values over newer ones; a batch
whose results cannot be stored ends the worker before Faust acknowledges it."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from faust.types import TP

from coevolve.streams.worker.app import build_app
from coevolve.streams.worker.config import StreamsConfig
from coevolve.streams.worker.faust_compat import EXIT_UNSTORED, TrackedMemoryStore
from coevolve.streams.worker.metrics import Metrics

CHANGELOG = TP("t-app-step_to_counts-changelog", 1)

pytestmark = pytest.mark.integration


def record(offset: int, key: str, count: int, tp: TP = CHANGELOG):
    """A changelog record as Faust's recovery hands it to the store."""
    value = json.dumps({"counted": count}).encode()
    message = SimpleNamespace(tp=tp, partition=tp.partition, offset=offset, value=value)
    return SimpleNamespace(key=json.dumps(key).encode(), value=value, message=message)


def table(tmp_path):
    app = build_app(StreamsConfig(app_id="t-app", kafka_bootstrap="127.0.0.1:9", datadir=tmp_path), Metrics())
    return app.tables["step_to_counts"]


def apply(store, records):
    store.apply_changelog_batch(records, to_key=lambda k: json.loads(k), to_value=lambda v: json.loads(v))


def test_the_worker_tables_use_the_tracked_store(tmp_path):
    assert isinstance(table(tmp_path).data, TrackedMemoryStore)


def test_a_rebalance_reading_a_kept_changelog_again_keeps_the_newer_values(tmp_path):
    store = table(tmp_path).data
    assert store.persisted_offset(CHANGELOG) is None  # nothing reflected yet: read from the start
    apply(store, [record(0, "r\x1f1", 2), record(1, "r\x1f2", 1)])
    store["r\x1f1"] = {"counted": 5}  # a batch's write, its changelog record confirmed at offset 2
    store.set_persisted_offset(CHANGELOG, 2)
    store["r\x1f1"] = {"counted": 7}  # the next batch's write, its record still in flight
    assert store.persisted_offset(CHANGELOG) == 2
    apply(store, [record(0, "r\x1f1", 2), record(1, "r\x1f2", 1), record(2, "r\x1f1", 5)])  # re-read
    assert store["r\x1f1"] == {"counted": 7} and store["r\x1f2"] == {"counted": 1}
    apply(store, [record(3, "r\x1f2", 4)])  # what another writer added after is applied
    assert store["r\x1f2"] == {"counted": 4} and store.persisted_offset(CHANGELOG) == 3


def test_a_partition_that_moves_away_is_read_whole_when_it_comes_back(tmp_path):
    store, other = table(tmp_path).data, TP(CHANGELOG.topic, 0)
    apply(store, [record(0, "a", 1, other), record(4, "b", 1)])
    asyncio.run(store.on_recovery_completed({CHANGELOG}, set()))
    assert store.persisted_offset(other) is None and store.persisted_offset(CHANGELOG) == 4


FAILING_STORE = """
import asyncio
from types import SimpleNamespace

import pytest
from coevolve.services.runtime import log
from coevolve.streams.worker import faust_compat

log.configure()  # as the worker's service does

class Producer:
    async def send(self, *args):
        raise OSError("broker gone")

topic = SimpleNamespace(get_topic_name=lambda: "coevolve.signals")
app = SimpleNamespace(producer=Producer())
asyncio.run(faust_compat.store_batch(app, "rare", [(topic, b"k", b"v", None)]))
print("returned")
"""


def test_a_batch_that_cannot_be_stored_ends_the_worker_before_it_is_acknowledged():
    done = subprocess.run([sys.executable, "-c", FAILING_STORE], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_UNSTORED and "returned" not in done.stdout
    line = json.loads(next(s for s in done.stderr.splitlines() if "streams.batch.unstored" in s))
    assert line["agent"] == "rare" and "broker gone" in line["error"] and "committed offsets" in line["hint"]
