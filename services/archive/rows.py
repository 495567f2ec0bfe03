"""Map decoded events to archive rows: one table per event, a trajectory's actions exploded.

Pure functions over plain dicts, so the archiver and the tests share one mapping. A decoded event has
every field; a field missing from an event built in code (the simulator's, before encoding) takes its
schema default, as decoding would give it.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Callable

from coevolve.schemas.codec import SCHEMA_DIR

ORIGIN = ["log_partition", "log_offset"]

COLUMNS: dict[str, list[str]] = {
    "trajectories": ["event_id", "run_id", "step", "task_id", "task_source", "rollout_index", "group_size",
                     "score", "success", "turn_count", "policy_version", "prompt", "response",
                     "prompt_tokens", "completion_tokens", "produced_at", "action_names", *ORIGIN],
    "actions": ["event_id", "run_id", "step", "task_id", "position", "name", "arguments", "observation",
                "turn", "score", *ORIGIN],
    "steps": ["event_id", "run_id", "step", "trajectory_count", "policy_version", "train_reward",
              "eval_success", "loss", "duration_seconds", "pool_size", "pool_synthesized", "zero_variance_groups",
              "resampled_groups", "tokens_trained", "synthesized_trained", "synthesized_tasks_trained",
              "staleness_max", "staleness_mean", "stale_groups", "rollout_seconds", "scoring_seconds", "training_seconds",
              "push_seconds", "publish_seconds", "blocked_seconds", "produced_at", *ORIGIN],
    "signals": ["event_id", "kind", "run_id", "step", "subject", "task_id", "pattern", "success_threshold",
                "window", "rare_threshold", "pattern_length", "incomplete", "attempt_score", "scores",
                "previous_scores", "pattern_count", "pattern_total", "evidence", "produced_at", *ORIGIN],
    "explorations": ["event_id", "run_id", "step", "signal_id", "signal_kind", "task_id", "round", "context",
                     "tuples", "model", "strategy", "signal_ids", "produced_at", *ORIGIN],
    "tasks": ["event_id", "task_id", "run_id", "step", "source", "verdict", "reason", "env",
              "instruction_turns", "initial_state", "involved_classes", "reference_solution", "signal_ids",
              "exploration_ids", "validation_score", "stage", "stages", "seed_task_id", "produced_at", *ORIGIN],
    "evaluations": ["event_id", "run_id", "step", "policy_version", "split", "env", "task_count", "success_rate",
                    "mean_score", "task_ids", "scores", "duration_seconds", "produced_at", *ORIGIN],
    "policy_updates": ["event_id", "run_id", "step", "version", "backend", "bytes", "seconds", "servers",
                       "servers_behind", "produced_at", *ORIGIN],
    "deadletters": ["event_id", "source_topic", "source_partition", "source_offset", "key", "payload",
                    "error_type", "reason", "service", "produced_at", *ORIGIN],
}

TABLE_OF = {"TrajectoryRecorded": "trajectories", "StepCompleted": "steps", "SignalRaised": "signals",
            "ExplorationRecorded": "explorations", "TaskChecked": "tasks", "EvaluationCompleted": "evaluations",
            "PolicyUpdated": "policy_updates", "DeadLettered": "deadletters"}


_FIELDS = {table: cols[:-len(ORIGIN)] for table, cols in COLUMNS.items() if cols[-1] == ORIGIN[-1]}
_TRAJECTORY_FIELDS = COLUMNS["trajectories"][:-3]


def schema_defaults(name: str) -> dict:
    """The fields of an event's current schema that have a default, with it."""
    fields = json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())["fields"]
    return {f["name"]: f["default"] for f in fields if "default" in f}


_DEFAULTS = {table: schema_defaults(name) for name, table in TABLE_OF.items()}
_MISSING = object()


def _plain(event: dict, table: str) -> list:
    row = [event.get(c, _MISSING) for c in _FIELDS[table]]
    if any(v is _MISSING for v in row):
        defaults = _DEFAULTS[table]
        row = [defaults[c] if v is _MISSING else v for c, v in zip(_FIELDS[table], row)]
    return row


def _trajectory(event: dict) -> list:
    row = [event[c] for c in _TRAJECTORY_FIELDS]
    row.append([a["name"] for a in event["actions"]])
    return row


def _signal(event: dict) -> list:
    th, ev = event["thresholds"], event["evidence"]
    return [event["event_id"], event["kind"], event["run_id"], event["step"], event["subject"],
            event.get("task_id"), list(event.get("pattern") or []), th["success_threshold"], th["window"],
            th["rare_threshold"], th["pattern_length"], event.get("incomplete", False),
            ev.get("attempt_score"), list(ev.get("scores") or []), list(ev.get("previous_scores") or []),
            ev.get("pattern_count", 0), ev.get("pattern_total", 0), json.dumps(ev, sort_keys=True),
            event["produced_at"]]


def _exploration(event: dict) -> list:
    row = _plain(event, "explorations")
    row[COLUMNS["explorations"].index("tuples")] = [
        (t["name"], t["arguments"], t["observation"], t["task_id"]) for t in event["tuples"]]
    return row


def _task(event: dict) -> list:
    row = _plain(event, "tasks")
    at = COLUMNS["tasks"].index("stages")
    row[at] = [(s["stage"], s["passed"], s["reason"]) for s in row[at]]
    return row


def _bytes_text(value: bytes | None) -> str | None:
    """Kafka keys and payloads are bytes; keep valid UTF-8 as text and the rest as `base64:`."""
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode("ascii")


def _deadletter(event: dict) -> list:
    row = _plain(event, "deadletters")
    cols = COLUMNS["deadletters"]
    row[cols.index("key")] = _bytes_text(event.get("key"))
    row[cols.index("payload")] = "base64:" + base64.b64encode(event["payload"]).decode("ascii")
    return row


_MAPPERS: dict[str, Callable[[dict], list]] = {
    "TrajectoryRecorded": _trajectory, "SignalRaised": _signal, "ExplorationRecorded": _exploration,
    "DeadLettered": _deadletter,
    "TaskChecked": _task, "StepCompleted": lambda e: _plain(e, "steps"),
    "EvaluationCompleted": lambda e: _plain(e, "evaluations"),
    "PolicyUpdated": lambda e: _plain(e, "policy_updates"),
}


LOG = ["log_id", "topic", "partition", "offset", "key", "value", "timestamp_ms", "headers"]


def log_row(log_id: str, record) -> list:
    """A polled record (kafka-python's `ConsumerRecord`) as a row of the `log` table: its bytes as sent."""
    return [log_id, record.topic, record.partition, record.offset, record.key, record.value or b"",
            record.timestamp, [(name, value or b"") for name, value in record.headers or ()]]


def archivable(name: str) -> bool:
    """Whether the archive has a table for this record name."""
    return name in _MAPPERS


def rows_for(name: str, event: dict, partition: int, offset: int) -> dict[str, list[list]]:
    """The rows one event adds, per table; raise KeyError for a record with no table (see `archivable`)."""
    mapper = _MAPPERS[name]
    out = {TABLE_OF[name]: [mapper(event) + [partition, offset]]}
    if name == "TrajectoryRecorded":
        out["actions"] = [[event["event_id"], event["run_id"], event["step"], event["task_id"], i, a["name"],
                           a["arguments"], a["observation"], a.get("turn", 0), event["score"], partition, offset]
                          for i, a in enumerate(event["actions"])]
    return out
