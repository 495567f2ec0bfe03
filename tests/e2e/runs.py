"""What the e2e tests share: the `coevolve` command and a run's events read back from the broker."""
from __future__ import annotations

import sys
from pathlib import Path

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.topics import CATALOG

EXE = str(Path(sys.executable).with_name("coevolve"))


def events(bootstrap: str, run_id: str, dedupe: bool = True) -> dict[str, list[dict]]:
    """The run's events on the broker, by event name (each event id once unless `dedupe` is False)."""
    consumer = EventConsumer(bootstrap, list(CATALOG), service="test")
    try:
        out: dict[str, list[dict]] = {}
        for item in consumer.drain(idle_s=2.0):
            if item.event.get("run_id") in (run_id, None) or item.name == "TaskChecked":
                out.setdefault(item.name, []).append(item.event)
    finally:
        consumer.close()
    if dedupe:
        out = {name: list({e["event_id"]: e for e in found}.values()) for name, found in out.items()}
    return out


def trained_steps(found: dict[str, list[dict]]) -> list[int]:
    """The steps whose `StepCompleted` reports a GRPO update (a loss)."""
    return sorted(e["step"] for e in found["StepCompleted"] if e["loss"] is not None)
