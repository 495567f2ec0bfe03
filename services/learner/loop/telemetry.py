"""The learner's metrics (`learner_*` on its /metrics) and the log lines of its steps and weight pushes."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coevolve.services.learner.loop.record import PHASES, StepRecord


class Telemetry:
    """Every metric of the learner service, on `registry`; `stepped` and `pushed` record a step and a push."""

    def __init__(self, registry: CollectorRegistry, log: Any):
        reg, self.log = registry, log
        self.steps = Counter("learner_steps", "Training steps completed and published.", registry=reg)
        self.trajectories = Counter("learner_trajectories", "Trajectories published.", registry=reg)
        self.reward = Gauge("learner_train_reward", "Mean rollout reward of the last step.", registry=reg)
        self.eval = Gauge("learner_eval_success_rate", "Held-out success rate at the last evaluation.",
                          registry=reg)
        self.version = Gauge("learner_policy_version", "Policy version in the rollout engine.", registry=reg)
        self.pool = Gauge("learner_pool_tasks", "Tasks in the sampler's pool, by source.", ["source"], registry=reg)
        self.step_s = Histogram("learner_step_seconds", "Wall time of a training step.", registry=reg,
                                buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600))
        self.phase = Counter("learner_phase_seconds", "Seconds spent per phase of the steps.", ["phase"],
                             registry=reg)
        self.blocked = Gauge("learner_blocked_share", "Share of wall time blocked on the loop (taking tasks in).",
                             registry=reg)
        self.replayed = Counter("learner_steps_replayed", "Journaled steps replayed at a resume.", registry=reg)
        self.pushes = Counter("learner_weight_updates", "Weight updates pushed into the rollout engine.",
                              registry=reg)
        self.push_s = Histogram("learner_weight_update_seconds", "Wall time of one weight push.", registry=reg,
                                buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120))
        self.behind = Gauge("learner_servers_behind", "Fleet servers a failed transfer left on an older policy.",
                            registry=reg)
        self.rank_s = Gauge("learner_rank_seconds", "Seconds of each rank's part of the last update, by phase "
                            "(training: forward and backward; reduce: the optimizer step and the collectives "
                            "outside the backward).", ["rank", "phase"], registry=reg)
        self.unloadable = Counter("learner_tasks_unloadable", "Tasks refused or dropped from the pool because "
                                  "their episodes cannot start.", registry=reg)

    def evaluated(self, step: int, evaluation: dict[str, Any]) -> None:
        """An evaluation outside any step (the starting policy's, as step 0)."""
        self.eval.set(evaluation["success_rate"])
        self.log.info("learner.evaluated", step=step, success_rate=evaluation["success_rate"],
                      mean_score=evaluation["mean_score"], tasks=evaluation["task_count"])

    def failed(self, step: int, error: Exception, fix: str) -> None:
        """A step that ends the learner (the supervisor restarts it with --resume)."""
        self.log.error("learner.step_failed", step=step, reason=f"{type(error).__name__}: {error}",
                       fix=f"{fix}, then rerun with --resume")

    def pushed(self, push: dict[str, Any]) -> None:
        """A weight push (a step's `PolicyUpdated` record)."""
        self.pushes.inc()
        self.push_s.observe(push["seconds"])
        self.behind.set(push["servers_behind"])
        self.log.info("learner.policy_updated", version=push["version"], seconds=round(push["seconds"], 3),
                      bytes=push["bytes"], servers=push["servers"], servers_behind=push["servers_behind"])

    def stepped(self, rec: StepRecord, evaluation: dict[str, Any] | None, blocked_share: float,
                rank_times: list[dict[str, float]]) -> None:
        """A published step, its evaluation if any, and with several ranks each rank's `rank_times`."""
        self.steps.inc()
        self.trajectories.inc(rec.trajectory_count)
        self.reward.set(rec.train_reward)
        self.version.set(rec.policy_version)
        self.pool.labels("seed").set(rec.pool_size - rec.pool_synthesized)
        self.pool.labels("synthesized").set(rec.pool_synthesized)
        self.step_s.observe(rec.duration_seconds)
        for phase in PHASES:
            self.phase.labels(phase).inc(getattr(rec, f"{phase}_seconds") or 0.0)
        self.blocked.set(blocked_share)
        if evaluation is not None:
            self.eval.set(evaluation["success_rate"])
        self.log.info("learner.step", step=rec.step, reward=round(rec.train_reward, 4), loss=rec.loss,
                      trajectories=rec.trajectory_count, pool=rec.pool_size, synthesized=rec.pool_synthesized,
                      version=rec.policy_version, seconds=round(rec.duration_seconds, 2), eval_success=rec.eval_success,
                      **self._rank_split(rec, rank_times))

    def _rank_split(self, rec: StepRecord, times: list[dict[str, float]]) -> dict[str, Any]:
        """With several ranks: each rank's seconds by phase (rollout and push are rank 0's: it generates and
        sends, the others wait) and the slowest rank of the update; nothing with one rank or no update."""
        for rank, own in enumerate(times):
            for phase, seconds in own.items():
                self.rank_s.labels(str(rank), phase).set(seconds)
        if not times:
            return {}
        split = [{"rank": rank, "rollout": round(rec.rollout_seconds if rank == 0 else 0.0, 3),
                  "training": round(own["training"], 3), "reduce": round(own["reduce"], 3),
                  "push": round((rec.push_seconds or 0.0) if rank == 0 else 0.0, 3)} for rank, own in enumerate(times)]
        slowest = max(range(len(times)), key=lambda r: times[r]["training"] + times[r]["reduce"])
        return {"slowest_rank": slowest, "ranks": split}
