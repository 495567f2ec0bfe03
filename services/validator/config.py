"""The validator's settings: how proposed tasks are checked (ValidatorConfig), its service and dual-pass
attempts (ValidatorServiceConfig), and the parts it shares with other services (ValidatorSettings).

Each key is `VALIDATOR_<FIELD>`, then `<FIELD>`, in the environment, `validator.<field>` in a preset,
or a flag of `coevolve validator` (services/runtime/config.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from coevolve.services.agent.config import BackendConfig, EpisodeLimits, GenerationConfig
from coevolve.services.runtime.config import ConfigError, ConsumerConfig, Settings, doc


@dataclass(frozen=True)
class ValidatorConfig:
    """How proposed tasks are checked."""

    validation: bool = doc(True, "Run the executable, novel and dual-pass stages; false (--no-validation) "
                                 "is the paper's ablation and keeps every well-formed task.")
    inherit_tasks: bool = doc(False, "Check a run's proposals for novelty against the tasks every run validated "
                                     "on this broker; false: against the seeds and that run's own.")
    similarity_threshold: float = doc(90.0, "Instructions at least this similar (rapidfuzz token_sort_ratio, "
                                            "0-100) to a known task's make a proposal a near-duplicate.")
    max_turns: int = doc(6, "Most user turns a proposed task may have.")
    task_calls_per_turn: int = doc(4, "Most reference calls in one of its turns (a chain of calls is cut to "
                                      "max_turns x task_calls_per_turn).")
    reference_from_exploration: bool = doc(True, "Every reference call is one of the group's explored calls "
                                                 "that succeeded (enforced by the schema, so constrained "
                                                 "decoding cannot invent one), with the seed's classes and "
                                                 "initial state; false lets the model write any call, name "
                                                 "the classes and patch the state.")
    instructions: str = doc("model", "Who writes the task: model (the abstraction's LLM writes each turn's "
                                     "instruction and chooses its calls, as in the paper) or calls (for a model "
                                     "too small to write one: the group's longest chain of explored calls that "
                                     "worked, in order, split into turns, each instruction written from the "
                                     "tools' and parameters' own descriptions).")
    parse_attempts: int = doc(3, "Model answers tried per abstraction before the group is dead-lettered.")
    rounds_per_group: int = doc(3, "Exploration rounds that make a complete group (the explorer's runs).")

    def __post_init__(self) -> None:
        if self.instructions not in ("model", "calls"):
            raise ConfigError(f"instructions={self.instructions!r}: choose model or calls")
        if self.instructions == "calls" and not self.reference_from_exploration:
            raise ConfigError("instructions=calls takes the task's calls from the exploration: set "
                              "reference_from_exploration=true, or instructions=model to let the model write them")
        if not 0 < self.similarity_threshold <= 100:
            raise ConfigError(f"similarity_threshold={self.similarity_threshold} must be in (0, 100]; "
                              "100 flags only identical instructions")
        for name in ("max_turns", "task_calls_per_turn", "parse_attempts", "rounds_per_group"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")


@dataclass(frozen=True)
class ValidatorServiceConfig(ConsumerConfig):
    """The validator service: how long a group waits, and its dual-pass attempts."""

    group_wait_s: float = doc(60.0, "Abstract an incomplete exploration group after it waited this long.")
    attempts: int = doc(1, "Dual-pass attempts per task, in one batch; the task is kept when any succeeds or "
                           "earns a positive partial score.")
    attempt_temperature: float = doc(0.0, "Sampling temperature of the dual-pass attempts; 0 is greedy (one "
                                          "attempt), above 0 samples each attempt with its own seed.")
    catalog_read_s: float = doc(120.0, "Seconds to read coevolve.tasks to its end at start; a read that falls "
                                       "short stops the start (it would judge a redelivered group again).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_wait_s <= 0 or self.catalog_read_s <= 0:
            raise ConfigError(f"group_wait_s={self.group_wait_s} and catalog_read_s={self.catalog_read_s} must "
                              "be > 0")
        if self.attempts < 1 or self.attempt_temperature < 0:
            raise ConfigError(f"attempts={self.attempts} must be >= 1 and attempt_temperature="
                              f"{self.attempt_temperature} >= 0")
        if self.attempts > 1 and self.attempt_temperature == 0:
            raise ConfigError(f"attempts={self.attempts} greedy attempts would all be the same episode: set "
                              "attempt_temperature above 0 (e.g. 1.0) or attempts=1")


class ValidatorSettings(Settings):
    """Everything `coevolve validator` reads: the abstraction samples at generation.temperature with
    json_max_new_tokens, the dual-pass attempts at attempt_temperature with max_new_tokens, as episodes
    bounded by `limits` (whose tool_docs, under run.shared_policy, is the learner's)."""

    validator: ValidatorConfig
    service: ValidatorServiceConfig
    generation: GenerationConfig
    backend: BackendConfig
    limits: EpisodeLimits
