"""Prometheus metrics of the signal processors, in the service's registry (no module state)."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The agents that read the tick messages (app.py's `tick` timer): each must handle one within the
# worker's allowance, or its /healthz fails.
TICKED = ("attempts", "rare")


class Metrics:
    """signals/raised_total, signals/already_on_log_total, signals/trajectories_total, signals/deadletter_total, signals/steps_total,
    signals/batch_seconds, signals/agent_tick_timestamp_seconds."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.raised = Counter("signals_raised_total", "Signals raised, by kind.", ["kind"],
                              registry=self.registry)
        self.on_log = Counter("signals_already_on_log_total", "Signals raised again by a worker that started over "
                              "a log already holding them (not sent again), by kind.", ["kind"], registry=self.registry)
        self.trajectories = Counter("signals_trajectories_total", "Trajectories seen, by outcome "
                                    "(accepted, duplicate, late).", ["outcome"], registry=self.registry)
        self.dead_lettered = Counter("signals_deadletter_total", "Inputs sent to the dead-letter topic, "
                                     "by error type.", ["error_type"], registry=self.registry)
        self.steps = Counter("signals_steps_total", "Completed steps, by stage: forwarded (to the rare agent), "
                             "closed_by_count, closed_by_grace.", ["stage"], registry=self.registry)
        self.batch_seconds = Histogram("signals_batch_seconds", "Time to process one batch, by agent.",
                                       ["agent"], registry=self.registry)
        self.tick_at = Gauge("signals_agent_tick_timestamp_seconds", "Unix time each agent last handled a "
                             "tick message, by agent (attempts, rare).", ["agent"], registry=self.registry)
        self.ticked_at: dict[str, float] = {}  # agent -> time.monotonic() of its last tick

    def ticked(self, agent: str) -> None:
        """The agent handled a tick: the worker's loop, consumer and that agent make progress."""
        self.ticked_at[agent] = time.monotonic()
        self.tick_at.labels(agent).set(time.time())
