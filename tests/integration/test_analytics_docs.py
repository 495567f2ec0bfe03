"""Every ready query in docs/analytics.md runs on an archive of the loop's events and returns rows."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from coevolve.schemas import default_registry
from coevolve.services.archive.rows import COLUMNS, rows_for
from coevolve.services.clickhouse.client import connect
from coevolve.services.simulate import SimulationConfig, Simulator
from tests.events import sample_events
from tests.loop_events import loop_run

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[2] / "docs" / "analytics.md"


def _queries() -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    return [q.strip() for block in blocks for q in block.split(";") if q.strip()]


def test_the_documented_queries_run(tmp_path):
    registry = default_registry()
    events = [(name, event) for _, name, event in loop_run()] + list(sample_events().items())
    events += [(name, event) for _, _, name, event in Simulator(SimulationConfig(steps=3, tasks=8, batch_tasks=4)).events()]
    client = connect(f"chdb://{tmp_path}/ch")
    try:
        for name, event in events:
            for table, rows in rows_for(*registry.decode(registry.encode(name, event)), 0, 0).items():
                client.insert(f"coevolve.{table}", rows, column_names=COLUMNS[table])
        queries = _queries()
        assert len(queries) >= 13
        for query in queries:
            assert client.query(query).result_rows, query
    finally:
        client.close()
