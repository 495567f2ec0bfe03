"""Which tasks a run trains on and explores: the seed pool, one part of the learner's and the explorer's
settings, so that both read the same categories and count."""
from __future__ import annotations

from dataclasses import dataclass

from coevolve.services.runtime.config import ConfigError, doc


@dataclass(frozen=True)
class SeedPoolConfig:
    """The seed tasks: the train split of some BFCL categories, interleaved (bfcl_data.seed_pool)."""

    categories: str = doc("multi_turn_base", "Comma-separated BFCL categories of the seed pool.")
    seed_tasks: int = doc(0, "Seed tasks taken from the train split of those categories; 0 takes all.")

    def __post_init__(self) -> None:
        if not self.category_list:
            raise ConfigError("categories is empty; name at least one BFCL category, e.g. multi_turn_base")
        if self.seed_tasks < 0:
            raise ConfigError(f"seed_tasks={self.seed_tasks} must be >= 0 (0 takes all)")

    @property
    def category_list(self) -> list[str]:
        return [c.strip() for c in self.categories.split(",") if c.strip()]

    def tasks(self) -> list:
        """The seed tasks, in the order the learner draws them from."""
        from coevolve.services.envs.bfcl_data import seed_pool

        return seed_pool(self.category_list, self.seed_tasks)
