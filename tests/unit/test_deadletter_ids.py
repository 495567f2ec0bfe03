"""Dead-letter ids and the `--since` of `coevolve deadletters list`."""
import pytest

from coevolve.services.kafka.consumer import dead_letter
from coevolve.services.kafka.deadletters import since_ms, summarize


def test_the_same_input_rejected_for_the_same_reason_is_the_same_letter():
    first = dead_letter("coevolve.steps", 0, 7, b"k", b"x", "malformed", "a model said one thing", "explorer")
    again = dead_letter("coevolve.steps", 0, 7, b"k", b"x", "malformed", "and then another", "explorer")
    assert first["event_id"] == again["event_id"]
    others = [dead_letter("coevolve.steps", 0, 8, b"k", b"x", "malformed", "", "explorer"),
              dead_letter("coevolve.steps", 0, 7, b"k", b"x", "invalid", "", "explorer"),
              dead_letter("coevolve.steps", 0, 7, b"k", b"x", "malformed", "", "validator")]
    assert len({first["event_id"], *(o["event_id"] for o in others)}) == 4


def test_an_input_without_an_offset_is_identified_by_its_bytes():
    a = dead_letter("coevolve.tasks", None, None, None, b"task a", "task_unloadable", "", "learner")
    b = dead_letter("coevolve.tasks", None, None, None, b"task b", "task_unloadable", "", "learner")
    assert a["event_id"] != b["event_id"]
    assert a["event_id"] == dead_letter("coevolve.tasks", None, None, None, b"task a", "task_unloadable", "x",
                                        "learner")["event_id"]


def test_since_takes_durations_and_iso_times():
    assert since_ms("90s", now_s=1000.0) == 910_000 and since_ms("2h", now_s=10_000.0) == 2_800_000
    assert since_ms("1970-01-01T00:01:00") == 60_000 and since_ms("1970-01-01T01:00:00+01:00") == 0
    with pytest.raises(ValueError, match="neither a duration"):
        since_ms("yesterday")


def test_the_summary_counts_by_service_and_reason_with_the_newest_first():
    letters = [{"service": "validator", "error_type": "invalid", "n": i} for i in range(5)]
    letters.append({"service": "explorer", "error_type": "malformed", "n": 9})
    summary = summarize(letters, examples=2)
    assert summary.counts[("validator", "invalid")] == 5 and summary.counts[("explorer", "malformed")] == 1
    assert [letter["n"] for letter in summary.newest[("validator", "invalid")]] == [4, 3]
