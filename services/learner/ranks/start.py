"""Every rank's engine, built in one place: the ranks' one way into the trainer room.

Rank 0 (the service) knows the starting policy once its rollout backend is up; it tells every other
rank (`worker.py`) where the weights are and the pad id, every rank builds the engine over them
alike (`trainer.build.load_engine`), and rank 0 drives no one before every rank has its engine.
"""
from __future__ import annotations

from typing import Any

from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.ranks.driver import Driver
from coevolve.services.learner.ranks.group import Ranks, complete, share
from coevolve.services.learner.trainer.build import load_engine


def start_engine(ranks: Ranks, grpo: GRPOConfig, seed: int, policy: dict[str, Any] | None = None) -> Any:
    """This rank's engine over rank 0's starting `policy` ({"model": folder, "pad_id": id}; None on the
    other ranks, which receive rank 0's), on the rank's GPU where there is one. With one rank the engine
    itself; with several, rank 0 gets the `Driver` of the others and every other rank its own engine,
    for `driver.follow`."""
    from coevolve.services.agent.precision import default_device

    policy = share(policy)
    device = ranks.device() if ranks.many else default_device()
    engine = load_engine(policy["model"], grpo, policy["pad_id"], seed, device)
    if not ranks.many:
        return engine
    complete()  # every rank has its engine before rank 0 drives them
    return Driver(engine) if ranks.driver else engine
