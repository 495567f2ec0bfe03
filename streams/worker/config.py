"""Configuration of the signal stream processors (`coevolve streams worker`); thresholds and evidence
limits default to streams.rules'."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coevolve.services.kafka.settings import FETCH_MAX_WAIT_MS
from coevolve.services.runtime.config import ConfigError, ServiceConfig, doc
from coevolve.streams.rules import EvidenceLimits, Thresholds


@dataclass(frozen=True)
class StreamsConfig(ServiceConfig):
    """The signal worker: its Faust app, the signal rules' thresholds and evidence, batching and timing."""

    app_id: str = doc("coevolve-signals", "Faust app id: consumer group and prefix of internal topics and tables.")
    success_threshold: float = doc(Thresholds.success_threshold, "tau: a score succeeds at >= tau.")
    window: int = doc(Thresholds.window, "W: previous attempts forgetting looks back on.")
    rare_threshold: float = doc(Thresholds.rare_threshold, "theta, percent: a pattern is rare when 0 < c_p/N < theta/100.")
    pattern_length: int = doc(Thresholds.pattern_length, "n: consecutive action names per pattern.")
    grace_s: float = doc(120.0, "A step not complete this long after its last event closes, flagged incomplete.")
    observation_chars: int = doc(EvidenceLimits.observation_chars, "Evidence: characters kept of each observation.")
    max_actions: int = doc(EvidenceLimits.max_actions, "Evidence: actions kept per trajectory.")
    rare_trajectories: int = doc(EvidenceLimits.rare_trajectories, "Evidence: trajectories kept per rare pattern (smallest event ids).")
    batch_size: int = doc(2000, "Events an agent takes per batch; tables are written once per batch.")
    batch_within_s: float = doc(0.1, "Longest wait to fill a batch, seconds.")
    tick_s: float = doc(1.0, "How often the grace period and idle markers are checked, seconds.")
    marker_idle_s: float = doc(2.0, "A completed step closes its partition's open groups at the first "
                               "trajectory of a later step, or after the partition is idle this long.")
    fetch_wait_ms: int = doc(FETCH_MAX_WAIT_MS, "Longest a consumer fetch waits for data at the broker (Faust's "
                             "fixed 1500 is overridden).")
    replication_factor: int = doc(1, "Replicas of the topics the worker creates (internal and changelog topics).")
    datadir: Path = doc(Path(".coevolve/streams"), "Faust's data directory.")
    log_level: str = doc("warning", "Faust's own log level.")

    def __post_init__(self) -> None:
        try:
            self.thresholds()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.batch_size < 1 or self.batch_within_s <= 0:
            raise ConfigError("batch_size must be >= 1 and batch_within_s > 0")
        if self.grace_s <= 0 or self.tick_s <= 0:
            raise ConfigError("grace_s and tick_s must be positive")
        if self.replication_factor < 1:
            raise ConfigError(f"replication_factor={self.replication_factor}: must be >= 1")

    def group(self, service: str) -> str:
        """The worker's consumer group: its Faust app id."""
        return self.app_id

    def thresholds(self) -> Thresholds:
        return Thresholds(self.success_threshold, self.window, self.rare_threshold, self.pattern_length)

    def limits(self) -> EvidenceLimits:
        return EvidenceLimits(observation_chars=self.observation_chars, max_actions=self.max_actions,
                              rare_trajectories=self.rare_trajectories)
