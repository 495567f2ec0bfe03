"""Environments: the task shape, the environment contract, and BFCL multi-turn as the first backend."""
from __future__ import annotations

from coevolve.services.envs.base import Environment, Policy, StepResult, Task, TurnVerdict, run_episode

ENVIRONMENTS = ("bfcl",)


def make_env(name: str = "bfcl", **config):
    """A fresh environment of the named kind (one per concurrent episode)."""
    if name == "bfcl":
        from coevolve.services.envs.bfcl import BfclConfig, BfclEnv
        return BfclEnv(BfclConfig(**config))
    raise ValueError(f"unknown environment {name!r}; available: {', '.join(ENVIRONMENTS)}")


__all__ = ["ENVIRONMENTS", "Environment", "Policy", "StepResult", "Task", "TurnVerdict", "make_env", "run_episode"]
