"""Event schemas (one .avsc per event) and their single-object Avro wire format."""
from coevolve.schemas.codec import (
    DecodeError,
    EncodeError,
    MalformedMessageError,
    SchemaRegistry,
    UnknownSchemaError,
    default_registry,
)

EVENTS = (
    "TrajectoryRecorded",
    "StepCompleted",
    "SignalRaised",
    "ExplorationRecorded",
    "TaskChecked",
    "EvaluationCompleted",
    "PolicyUpdated",
    "DeadLettered",
)

__all__ = [
    "EVENTS",
    "DecodeError",
    "EncodeError",
    "MalformedMessageError",
    "SchemaRegistry",
    "UnknownSchemaError",
    "default_registry",
]
