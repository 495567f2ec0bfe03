"""The mapping of events to archive rows, and the importer's column expressions, without an engine."""
from __future__ import annotations

import json

import pytest

from coevolve.schemas.codec import HISTORY_DIR, SCHEMA_DIR
from coevolve.schemas.container import LogFileError
from coevolve.services.archive.importer import IMPORTABLE, _default_sql, _select
from coevolve.services.archive.rows import COLUMNS, ORIGIN, TABLE_OF, archivable, rows_for
from coevolve.services.kafka.topics import CATALOG
from tests.events import sample_events


def test_every_event_schema_and_topic_has_a_table():
    names = {p.stem for p in SCHEMA_DIR.glob("*.avsc")}
    assert set(TABLE_OF) == names  # a new schema without a table fails here, not in production
    assert {t.event for t in CATALOG.values()} <= names
    assert set(TABLE_OF.values()) | {"actions"} == set(COLUMNS)
    assert not archivable("ProbeRecorded")
    with pytest.raises(KeyError):
        rows_for("ProbeRecorded", {}, 0, 0)


@pytest.mark.parametrize("name", sorted(sample_events()))
def test_each_event_gives_one_full_row_ending_in_its_position(name):
    event = sample_events()[name]
    rows = rows_for(name, event, 2, 41)
    table = TABLE_OF[name]
    assert len(rows[table]) == 1
    row = dict(zip(COLUMNS[table], rows[table][0], strict=True))
    assert (row["event_id"], row["log_partition"], row["log_offset"]) == (event["event_id"], 2, 41)
    plain = [f for f in row if isinstance(event.get(f, b""), (str, int, float, type(None)))]
    assert len(plain) > 5 and all(row[f] == event[f] for f in plain), name  # scalars copied as they are


def test_new_fields_are_stored():
    events = sample_events()
    step = dict(zip(COLUMNS["steps"], rows_for("StepCompleted", events["StepCompleted"], 0, 0)["steps"][0]))
    assert (step["pool_size"], step["pool_synthesized"], step["tokens_trained"], step["blocked_seconds"]) == \
        (120, 7, 9000, 0.001)
    task = dict(zip(COLUMNS["tasks"], rows_for("TaskChecked", events["TaskChecked"], 0, 0)["tasks"][0]))
    assert task["stage"] == "executable" and task["seed_task_id"] == "multi_turn_base_7"
    assert task["stages"] == [("well_formed", True, "2 calls parse"), ("executable", False, "reference call failed")]
    exploration = dict(zip(COLUMNS["explorations"],
                           rows_for("ExplorationRecorded", events["ExplorationRecorded"], 0, 0)["explorations"][0]))
    assert exploration["strategy"] == "signal-guided" and exploration["signal_ids"] == []
    evaluation = dict(zip(COLUMNS["evaluations"],
                          rows_for("EvaluationCompleted", events["EvaluationCompleted"], 0, 0)["evaluations"][0]))
    assert evaluation["scores"] == [1.0, 0.5] and evaluation["split"] == "test"


def test_fields_missing_from_an_unencoded_event_take_their_schema_defaults():
    v1_step = {k: v for k, v in sample_events()["StepCompleted"].items() if not k.endswith("_seconds")
               and k not in ("pool_size", "tokens_trained", "policy_version")}
    step = dict(zip(COLUMNS["steps"], rows_for("StepCompleted", v1_step, 0, 0)["steps"][0]))
    assert step["blocked_seconds"] is None and step["pool_size"] is None and step["policy_version"] == 0
    assert step["pool_synthesized"] == 7
    task = {k: v for k, v in sample_events()["TaskChecked"].items() if k not in ("stage", "stages", "seed_task_id")}
    row = dict(zip(COLUMNS["tasks"], rows_for("TaskChecked", task, 0, 0)["tasks"][0]))
    assert (row["stage"], row["stages"], row["seed_task_id"]) == (None, [], None)
    with pytest.raises(KeyError, match="run_id"):  # a field without a default is required
        rows_for("StepCompleted", {k: v for k, v in v1_step.items() if k != "run_id"}, 0, 0)


def test_sql_literals_of_avro_defaults():
    assert [_default_sql(v) for v in (None, [], "signal-guided", 0, True, 1.5)] == \
        ["NULL", "[]", "'signal-guided'", "0", "true", "1.5"]
    with pytest.raises(ValueError, match="no SQL literal"):
        _default_sql({"a": 1})


def test_a_file_of_an_older_version_reads_new_columns_at_their_defaults():
    v1 = {f["name"] for f in json.loads((HISTORY_DIR / "StepCompleted.v1.avsc").read_text())["fields"]}
    columns, exprs = _select("StepCompleted", v1, "RUN", "EID")
    got = dict(zip(columns, exprs))
    assert got["event_id"] == "EID" and got["run_id"] == "RUN" and got["loss"] == "loss"
    assert got["pool_size"] == got["blocked_seconds"] == "NULL"
    v1 = {f["name"] for f in json.loads((HISTORY_DIR / "ExplorationRecorded.v1.avsc").read_text())["fields"]}
    got = dict(zip(*_select("ExplorationRecorded", v1, "RUN", "EID")))
    assert (got["strategy"], got["signal_ids"]) == ("'signal-guided'", "[]")
    with pytest.raises(LogFileError, match="lacks `split`"):
        _select("EvaluationCompleted", {"event_id", "run_id", "step", "policy_version"}, "RUN", "EID")
    assert "SignalRaised" not in IMPORTABLE and "EvaluationCompleted" in IMPORTABLE
