"""A training rank other than 0: its shard of the policy, trained as rank 0 commands (`driver.follow`).

It reads no topic and publishes nothing. It ignores SIGTERM and SIGINT: a stop is rank 0's to decide
at a step boundary, after which rank 0 releases it. It serves its own /metrics and /healthz on the
learner's metrics port + its local rank (rank 0 of a node has the port itself), with the seconds of
its last update split into training (forward and backward), reduce (the rest: the optimizer step and
the collectives outside the backward) and push (gathering the weights for the rollout engines).
"""
from __future__ import annotations

import signal
import time

import torch.distributed as dist
from prometheus_client import CollectorRegistry, Counter, Gauge

from coevolve.services.learner.config import LearnerSettings
from coevolve.services.learner.ranks.driver import follow
from coevolve.services.learner.ranks.group import Ranks, init_group
from coevolve.services.learner.ranks.start import start_trainer
from coevolve.services.runtime.health import serve
from coevolve.services.runtime.log import get_logger


def serve_rank(settings: LearnerSettings, ranks: Ranks) -> None:
    """Join the group, build the trainer over rank 0's starting policy, follow rank 0 until it stops."""
    log = get_logger("learner")
    ranks.check(settings.ranks.world_size)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    init_group(ranks)
    registry = CollectorRegistry()
    phase = Gauge("learner_rank_seconds", "Seconds of this rank's last update, by phase.", ["phase"],
                  registry=registry)
    updates = Counter("learner_rank_updates", "Updates this rank took part in.", registry=registry)
    state = {"trainer": None, "last_command": time.monotonic()}
    server = None
    port = settings.learner.metrics_port
    if port >= 0:
        try:
            server = serve(port + ranks.local_rank if port else 0, registry,
                           lambda: (True, {"rank": ranks.rank, "trainer": state["trainer"],
                                           "since_command_s": round(time.monotonic() - state["last_command"], 1)}),
                           settings.learner.metrics_host)
        except OSError as exc:
            log.warning("learner.rank_metrics_unavailable", rank=ranks.rank, port=port + ranks.local_rank,
                        reason=str(exc))
    trainer = start_trainer(ranks, settings.grpo, settings.backend.seed)  # once rank 0 has its starting policy
    state["trainer"] = type(trainer).__name__

    def observe(metrics: dict[str, float]) -> None:
        state["last_command"] = time.monotonic()
        if "push_seconds" in metrics:
            phase.labels("push").set(metrics["push_seconds"])
            return
        updates.inc()
        own = trainer.rank_times[ranks.rank]
        for name in ("training", "reduce"):
            phase.labels(name).set(own[name])

    log.info("learner.rank_ready", rank=ranks.rank, world_size=ranks.world_size, local_rank=ranks.local_rank,
             trainer=type(trainer).__name__, device=str(ranks.device()))
    try:
        follow(trainer, observe)
    finally:
        if server is not None:
            server.shutdown()
        dist.destroy_process_group()
    log.info("learner.rank_finished", rank=ranks.rank, updates=trainer.updates)
