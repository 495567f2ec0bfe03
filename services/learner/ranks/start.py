"""Every rank's trainer, built in one place: the ranks' one way into the trainer room.

Rank 0 (the service) knows the starting policy once its rollout backend is up; it tells every other
rank (`worker.py`) where the weights are and the pad id, every rank builds the trainer over them
alike (`trainer.build.load_trainer`), and rank 0 drives no one before every rank has its trainer.
"""
from __future__ import annotations

from typing import Any

from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.ranks.driver import Driver, Training
from coevolve.services.learner.ranks.group import Ranks, complete, share
from coevolve.services.learner.trainer.build import load_trainer


def start_trainer(ranks: Ranks, grpo: GRPOConfig, seed: int, policy: dict[str, Any] | None = None) -> Training:
    """This rank's trainer over rank 0's starting `policy` ({"model": folder, "pad_id": id}; None on the
    other ranks, which receive rank 0's), on the rank's GPU where there is one. With one rank the trainer
    itself; with several, rank 0 gets the `Driver` of the others and every other rank its own trainer,
    for `driver.follow`."""
    from coevolve.services.agent.precision import default_device

    policy = share(policy)
    device = ranks.device() if ranks.many else default_device()
    trainer = load_trainer(policy["model"], grpo, policy["pad_id"], seed, device)
    if not ranks.many:
        return trainer
    complete()  # every rank has its trainer before rank 0 drives them
    return Driver(trainer) if ranks.driver else trainer
