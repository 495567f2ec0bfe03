"""Task origin and lineage in the real engine (chDB) over the hand-made run of tests/mechanism_run.py:
the SQL views give what summary.json's mechanism gives, and a redelivered batch counts once."""
from __future__ import annotations

import pytest

from coevolve.services.analytics.lineage import lineage, task_origin
from coevolve.services.run.tally import Tally
from tests.integration.test_analytics_loop_sql import store
from tests.mechanism_run import events

pytestmark = pytest.mark.integration
DB = "lineageviews"  # chdb://memory is one engine per process: a database of its own


@pytest.fixture(scope="module")
def archive():
    from coevolve.services.clickhouse.client import connect

    client = connect("chdb://memory", database=DB)
    store(client, DB, events())
    store(client, DB, events())  # redelivered
    yield client
    client.close()


def test_origin_in_sql_equals_the_summarys(archive):
    view = task_origin(archive, DB, {"runs": ["r"]})
    rows = {(strategy, kind): (validated, trained) for _, strategy, kind, validated, trained in view.rows}
    assert rows == {("signal-guided", "boundary"): (2, 1), ("random-fallback", ""): (1, 0)}
    tally = Tally(run_id="r")
    for name, event in events():
        tally.add(name, event)
    counts = tally.mechanism.counts()
    assert sum(v for v, _ in rows.values()) == sum(counts["validated"].values())
    assert sum(t for _, t in rows.values()) == sum(counts["trained"].values())


def test_lineage_runs_from_each_signal_to_the_steps_that_trained_and_the_subject_after(archive):
    view = lineage(archive, DB, {"runs": ["r"]})
    rows = {r[1]: dict(zip(view.columns, r)) for r in view.rows}
    assert set(rows) == {"A", "B", "C", "D"} and rows["C"]["verdict"] == "rejected"
    a, d = rows["A"], rows["D"]
    assert (a["parent"], a["strategy"], a["signal_kind"], a["subjects"]) == \
        ("multi_turn_base_1", "signal-guided", "boundary", ["multi_turn_base_1"])
    assert (a["validated_at"], a["drawn_at"], a["trained_at"], a["explorations"]) == (1, [3], [3], 1)
    assert a["subject_score_raised"] == 0.5 and a["subject_score_after"] == 0.75  # base_1 drawn at step 4
    assert (d["parent"], d["subjects"], d["trained_at"], d["subject_score_after"]) == ("A", ["A"], [], None)
    assert rows["B"]["drawn_at"] == [3] and rows["B"]["trained_at"] == [] and rows["B"]["subjects"] == []
