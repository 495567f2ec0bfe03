"""The validator's settings that its core logic reads (stages, novelty threshold, retries).

Layered like every service's config (`services/config.py`): defaults, then `VALIDATOR_FIELD`, then
`FIELD` environment variables, then flags. Broker, model and metrics settings join when the service
skeleton lands.
"""
from __future__ import annotations

from dataclasses import dataclass

from coevolve.services.runtime.config import ConfigError, doc


@dataclass(frozen=True)
class ValidatorConfig:
    """How proposed tasks are checked."""

    validation: bool = doc(True, "Run the executable, novel and dual-pass stages; false (--no-validation) "
                                 "is the paper's ablation and keeps every well-formed task.")
    similarity_threshold: float = doc(90.0, "Instructions at least this similar (rapidfuzz token_sort_ratio, "
                                            "0-100) to a known task's make a proposal a near-duplicate.")
    max_turns: int = doc(6, "Most user turns a proposed task may have.")
    max_calls_per_turn: int = doc(4, "Most reference calls in one of its turns.")
    reference_from_exploration: bool = doc(True, "Every reference call is one of the group's explored calls "
                                                 "that succeeded (enforced by the schema, so constrained "
                                                 "decoding cannot invent one), with the seed's classes and "
                                                 "initial state; false lets the model write any call, name "
                                                 "the classes and patch the state.")
    instructions: str = doc("model", "Who writes each turn's instruction: model (the abstraction's LLM, as in the "
                                     "paper) or calls (the model chooses the reference calls; the instruction "
                                     "says what each tool does, with its arguments: for a model too small to "
                                     "describe what it chose).")
    parse_attempts: int = doc(3, "Model answers tried per abstraction before the group is dead-lettered.")
    rounds_per_group: int = doc(3, "Exploration rounds that make a complete group (the explorer's runs).")

    def __post_init__(self) -> None:
        if self.instructions not in ("model", "calls"):
            raise ConfigError(f"instructions={self.instructions!r}: choose model or calls")
        if not 0 < self.similarity_threshold <= 100:
            raise ConfigError(f"similarity_threshold={self.similarity_threshold} must be in (0, 100]; "
                              "100 flags only identical instructions")
        for name in ("max_turns", "max_calls_per_turn", "parse_attempts", "rounds_per_group"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
