"""The single-object wire format: header, fingerprints, round trips, evolution and typed errors."""
import copy
import json
import struct
from datetime import datetime, timezone

import pytest

from coevolve.schemas import (EVENTS, EncodeError, MalformedMessageError, SchemaRegistry,
                              UnknownSchemaError, default_registry)
from coevolve.schemas.codec import SCHEMA_DIR
from coevolve.schemas.fingerprint import crc64_avro, schema_fingerprint
from tests.events import sample_events


def test_fingerprints_match_the_avro_spec_vectors():
    # Values from the Avro specification's schema-fingerprint test vectors.
    assert schema_fingerprint('"int"') == 8247732601305521295
    assert schema_fingerprint('"null"') == 7195948357588979594
    assert crc64_avro(b"") == 0xC15D213AA4D7A795


def test_every_event_has_one_schema_file_named_after_its_record():
    names = sorted(p.stem for p in SCHEMA_DIR.glob("*.avsc"))
    assert names == sorted(EVENTS)
    for name in names:
        assert json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())["name"] == name


@pytest.mark.parametrize("name", EVENTS)
def test_round_trip_every_event_type(name):
    registry = default_registry()
    event = sample_events()[name]
    data = registry.encode(name, event)
    assert data[:2] == b"\xc3\x01"
    assert struct.unpack("<Q", data[2:10])[0] == registry.fingerprint(name)
    decoded_name, decoded = registry.decode(data)
    assert decoded_name == name
    # timestamp-millis is a logical type: it decodes to an aware datetime.
    assert decoded.pop("produced_at") == datetime.fromtimestamp(event.pop("produced_at") / 1000, timezone.utc)
    assert decoded == event


def test_consumer_on_new_schema_reads_events_written_under_the_old_one(tmp_path):
    new = json.loads((SCHEMA_DIR / "TrajectoryRecorded.avsc").read_text())
    old = copy.deepcopy(new)
    # The old release had no token counts and no policy version.
    old["fields"] = [f for f in old["fields"] if f["name"] not in ("prompt_tokens", "completion_tokens",
                                                                    "policy_version")]
    history = tmp_path / "history"
    history.mkdir()
    (history / "TrajectoryRecorded.v0.avsc").write_text(json.dumps(old))
    registry = SchemaRegistry(history=history)
    old_fp = schema_fingerprint(old)
    assert old_fp != registry.fingerprint("TrajectoryRecorded")

    event = sample_events()["TrajectoryRecorded"]
    for field in ("prompt_tokens", "completion_tokens", "policy_version"):
        del event[field]
    data = registry.encode("TrajectoryRecorded", event, writer=old_fp)
    name, decoded = registry.decode(data)
    assert name == "TrajectoryRecorded"
    assert decoded["prompt_tokens"] == 0 and decoded["policy_version"] == 0  # reader defaults
    assert decoded["actions"] == event["actions"] and decoded["score"] == event["score"]

    # A registry without the old schema cannot read it, and says how to fix that.
    with pytest.raises(UnknownSchemaError, match="schemas/history"):
        default_registry().decode(data, "coevolve.trajectories", 2, 40)


def test_unknown_fingerprint_names_topic_partition_and_offset():
    data = b"\xc3\x01" + struct.pack("<Q", 12345) + b"\x00"
    with pytest.raises(UnknownSchemaError) as info:
        default_registry().decode(data, "coevolve.steps", 0, 99)
    err = info.value
    assert (err.topic, err.partition, err.offset) == ("coevolve.steps", 0, 99)
    assert "coevolve.steps[0]@99" in str(err) and err.error_type == "unknown_schema"


@pytest.mark.parametrize("data", [b"", b"\xc3", b"{\"json\": true}", b"\xc3\x02" + b"\x00" * 12])
def test_bytes_that_are_not_single_object_encoded_are_malformed(data):
    with pytest.raises(MalformedMessageError, match="coevolve.signals\\[1\\]@5"):
        default_registry().decode(data, "coevolve.signals", 1, 5)


def test_truncated_and_padded_bodies_are_malformed():
    registry = default_registry()
    data = registry.encode("StepCompleted", sample_events()["StepCompleted"])
    with pytest.raises(MalformedMessageError, match="does not decode"):
        registry.decode(data[:-5], "coevolve.steps", 0, 1)
    with pytest.raises(MalformedMessageError, match="trailing"):
        registry.decode(data + b"\x00\x00", "coevolve.steps", 0, 1)


def test_a_step_written_before_the_synthesized_counts_reads_them_as_null():
    registry = default_registry()
    v2 = schema_fingerprint(json.loads((SCHEMA_DIR / "history" / "StepCompleted.v2.avsc").read_text()))
    assert v2 in registry.writers and v2 != registry.fingerprint("StepCompleted")
    event = {k: v for k, v in sample_events()["StepCompleted"].items()
             if k not in ("synthesized_trained", "synthesized_tasks_trained")}
    _, decoded = registry.decode(registry.encode("StepCompleted", event, writer=v2))
    assert decoded["synthesized_trained"] is None and decoded["synthesized_tasks_trained"] is None
    assert decoded["tokens_trained"] == 9000



def test_a_step_written_as_eval_score_reads_as_eval_success():
    registry = default_registry()
    v4 = schema_fingerprint(json.loads((SCHEMA_DIR / "history" / "StepCompleted.v4.avsc").read_text()))
    assert v4 in registry.writers and v4 != registry.fingerprint("StepCompleted")
    event = {("eval_score" if k == "eval_success" else k): v for k, v in sample_events()["StepCompleted"].items()}
    _, decoded = registry.decode(registry.encode("StepCompleted", {**event, "eval_score": 0.75}, writer=v4))
    assert decoded["eval_success"] == 0.75 and "eval_score" not in decoded

def test_records_that_do_not_fit_their_schema_are_refused():
    registry = default_registry()
    bad = sample_events()["TrajectoryRecorded"]
    bad["score"] = "high"
    with pytest.raises(EncodeError, match="TrajectoryRecorded"):
        registry.encode("TrajectoryRecorded", bad)
    with pytest.raises(EncodeError, match="no schema named"):
        registry.encode("TrajectoryLost", {})


@pytest.mark.parametrize("name,added", [
    ("ExplorationRecorded", {"strategy": "signal-guided", "signal_ids": []}),
    ("TaskChecked", {"stage": None, "stages": [], "seed_task_id": None}),
])
def test_events_written_under_a_released_schema_in_history_read_with_the_new_fields_defaulted(name, added):
    registry = default_registry()
    old = json.loads((SCHEMA_DIR / "history" / f"{name}.v1.avsc").read_text())
    old_fp = schema_fingerprint(old)
    assert old_fp in registry.writers and old_fp != registry.fingerprint(name)
    event = sample_events()[name]
    for field in added:
        del event[field]
    _, decoded = registry.decode(registry.encode(name, event, writer=old_fp))
    for field, default in added.items():
        assert decoded[field] == default
    assert decoded["task_id"] == event["task_id"]
