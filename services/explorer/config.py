"""The explorer's settings: what it explores and how (ExplorerConfig), its service and per-period
limits (ExplorerServiceConfig), and the parts it shares with other services (ExplorerSettings).

Each key is `EXPLORER_<FIELD>`, then `<FIELD>`, in the environment, `explorer.<field>` in a preset,
or a flag of `coevolve explorer` (services/runtime/config.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from coevolve.services.agent.config import BackendConfig, EpisodeLimits, GenerationConfig
from coevolve.services.envs.config import SeedPoolConfig
from coevolve.services.runtime.config import ConfigError, ConsumerConfig, Settings, doc

STRATEGIES = ("signal-guided", "random", "random-calls", "static")
FALLBACK = "random-fallback"  # the strategy recorded for a period's fallback exploration
KINDS = ("forgetting", "boundary", "rare")


@dataclass(frozen=True)
class ExplorerConfig:
    """What the explorer explores, how much, and how."""

    strategy: str = doc("signal-guided", "signal-guided (reflect on each signal, then the model explores under "
                                         "that context), random (the same model and constrained calls on random "
                                         "seed tasks, no signal read: the paper's random exploration), "
                                         "random-calls (random valid calls, no model) or static (static_tasks "
                                         "seed tasks explored once at start, nothing after).")
    signal_kinds: str = doc("forgetting,boundary,rare", "Signal kinds explored, comma-separated; any subset "
                                                        "runs the paper's per-signal ablations.")
    signals_per_step: int = doc(4, "Signal clusters explored at each exploration point; the rest are "
                                   "counted as skipped.")
    every_steps: int = doc(1, "Explore once every N training steps, over the signals gathered since "
                              "(the paper synthesizes every 10 steps).")
    step_window_s: float = doc(300.0, "Close a gathering period this many seconds after its first signal "
                                      "when its StepCompleted has not arrived.")
    step_grace_s: float = doc(5.0, "Keep a period open this many seconds after its last step's StepCompleted "
                                   "for the signals raised from that step, which arrive after it.")
    cluster_by_task: bool = doc(True, "Explore a task's forgetting and boundary signals of one period "
                                      "together, as one cluster.")
    runs: int = doc(3, "R: independent exploration runs (rounds) per cluster.")
    calls_per_run: int = doc(8, "S: most tool calls in one exploration run.")
    random_seed: int = doc(0, "Seed of the random strategy; the same seed gives the same calls.")
    parse_attempts: int = doc(3, "Model answers tried per reflection (before the signal is dead-lettered) and "
                                 "per exploration call (before the run ends).")
    replay_failure: bool = doc(True, "A forgetting or boundary cluster's first run replays the failing rollout's "
                                     "calls up to its first failing one, so the model acts where it went wrong.")
    static_tasks: int = doc(4, "static: seed train tasks explored by random valid calls once, when the service "
                               "starts, each with a call that works (recorded at step 0 as strategy static).")
    fallback_tasks: int = doc(0, "When a period's exploration finds no call that succeeds (no signal explored, "
                                 "or only failing calls), also explore this many seed train tasks by the "
                                 "random strategy, recorded as random-fallback (0: off).")

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy={self.strategy!r} is not one of {', '.join(STRATEGIES)}; "
                              "set EXPLORER_STRATEGY or --strategy")
        kinds = [k.strip() for k in self.signal_kinds.split(",") if k.strip()]
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise ConfigError(f"signal_kinds={self.signal_kinds!r} must name one or more of "
                              f"{', '.join(KINDS)}, comma-separated (unknown: {', '.join(unknown) or 'none given'})")
        for name in ("signals_per_step", "every_steps", "runs", "calls_per_run", "parse_attempts", "static_tasks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.step_window_s <= 0:
            raise ConfigError(f"step_window_s={self.step_window_s} must be positive")
        if self.step_grace_s < 0 or self.fallback_tasks < 0:
            raise ConfigError(f"step_grace_s={self.step_grace_s} and fallback_tasks={self.fallback_tasks} "
                              "must be >= 0")

    @property
    def kinds(self) -> frozenset[str]:
        """The signal kinds explored, as a set."""
        return frozenset(k.strip() for k in self.signal_kinds.split(",") if k.strip())


@dataclass(frozen=True)
class ExplorerServiceConfig(ConsumerConfig):
    """The explorer service: its per-period limits and the run its start exploration is recorded under."""

    max_runs_per_period: int = doc(0, "Most exploration runs per period (0: no limit); the rest is skipped.")
    max_tokens_per_period: int = doc(0, "Most tokens (prompt and completion) per period (0: no limit).")
    max_seconds_per_period: float = doc(0.0, "Most wall time per period's exploration (0: no limit).")
    run_id: str = doc("static", "Run the static strategy's start exploration is recorded under (coevolve run "
                                "sets it).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.max_runs_per_period, self.max_tokens_per_period, self.max_seconds_per_period) < 0:
            raise ConfigError("period limits must be >= 0 (0: no limit)")


class ExplorerSettings(Settings):
    """Everything `coevolve explorer` reads. The seed pool (categories, seed_tasks) is the one the
    random strategies and the fallback explore: set it as the learner's. `limits` say how exploration
    prompts list the tools (tool_docs: under run.shared_policy, the learner's)."""

    refused: ClassVar[dict[str, str]] = {
        "max_user_turns": "an exploration run is one user turn",
        "max_calls_per_turn": "calls_per_run bounds an exploration run's calls",
        "max_context_tokens": "an exploration call's prompt is rebuilt for each call from clipped observations, "
                              "within the model's max_model_len",
        "max_backend_errors": "a call whose answers fail parse_attempts times ends its run"}

    explorer: ExplorerConfig
    service: ExplorerServiceConfig
    seeds: SeedPoolConfig
    generation: GenerationConfig
    backend: BackendConfig
    limits: EpisodeLimits
