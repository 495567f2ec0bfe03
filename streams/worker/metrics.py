"""Prometheus metrics of the signal processors, in the service's registry (no module state)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class Metrics:
    """signals/raised_total, signals/trajectories_total, signals/deadletter_total, signals/steps_total,
    signals/batch_seconds."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.raised = Counter("signals_raised_total", "Signals raised, by kind.", ["kind"],
                              registry=self.registry)
        self.trajectories = Counter("signals_trajectories_total", "Trajectories seen, by outcome "
                                    "(accepted, duplicate, late).", ["outcome"], registry=self.registry)
        self.dead_lettered = Counter("signals_deadletter_total", "Inputs sent to the dead-letter topic, "
                                     "by error type.", ["error_type"], registry=self.registry)
        self.steps = Counter("signals_steps_total", "Completed steps, by stage: forwarded (to the rare agent), "
                             "closed_by_count, closed_by_grace.", ["stage"], registry=self.registry)
        self.batch_seconds = Histogram("signals_batch_seconds", "Time to process one batch, by agent.",
                                       ["agent"], registry=self.registry)
