"""`coevolve learner`: GRPO steps on the streaming task pool, published as events (a runtime.Service).

Each `step()` is one GRPO step: run it (`step.StepRunner`, whose draws take the arrived tasks into the
pool first, on the look-ahead thread with max_policy_lag >= 1), evaluate when due, write the step's
journal entry (`journal.py`: the batch the update trained on, the records to publish, the pool after the
step), publish them (`publish.py`, each batch confirmed by the broker before the next), and checkpoint
every `checkpoint_every` steps, pruning the journal. A SIGTERM or SIGINT stops at the next step boundary.
A step that fails after its update (a push no server took, a publish the broker never confirmed) ends
the learner with `learner.step_failed` and the fix; `finish()` checkpoints only a step its weights hold.

Resuming. `--resume` restores the latest checkpoint, replays the journal's entries after it without
rollouts (`resume.py`, publishing what they hold), pushes the weights once, and trains on. A run on the
rollout fleet pushes its starting weights at start too: a long-lived fleet may serve another run's policy.

Unloadable tasks. A task whose episode cannot start is refused or dropped by the pool (sampler.py); the
learner dead-letters an arrival (publish.py), logs `learner.task_unloadable`, counts it, and trains on.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.episodes import EpisodesStopped
from coevolve.services.envs.hosts import bounded_tool_calls, register_tool_host
from coevolve.services.fleet.backend import FleetBackend
from coevolve.services.fleet.client import FleetError, WeightTransferError
from coevolve.services.kafka.producer import DeliveryError, EventProducer
from coevolve.services.learner.config import LearnerConfig, LearnerSettings, rollout_backend
from coevolve.services.learner.loop import checkpoint as ckpt, journal
from coevolve.services.learner.loop.evaluation import due, evaluate_all
from coevolve.services.learner.loop.feed import TaskFeed, tasks_consumer
from coevolve.services.learner.loop.publish import publish_evaluation, publish_journaled, report_unloadable
from coevolve.services.learner.loop.resume import redo_journaled, run_to_continue, step_on_log
from coevolve.services.learner.loop.results import StepOutcome
from coevolve.services.learner.loop.sampler import TaskPool
from coevolve.services.learner.loop.step import Reward, StepRunner
from coevolve.services.learner.loop.telemetry import Telemetry
from coevolve.services.learner.ranks.driver import Driver
from coevolve.services.learner.ranks.group import Ranks, init_group
from coevolve.services.learner.ranks.start import start_trainer
from coevolve.services.runtime.config import ConfigError
from coevolve.services.runtime.service import Service


class Learner(Service):
    """The GRPO learner; `run()` returns after step `cfg.steps` or a stop signal."""

    name = "learner"
    commits = False  # it consumes no offsets: the task feed rereads its compacted topic at every start
    stale_s = 900.0  # beats at every rollout round and step; training, evaluating and publishing must fit

    def __init__(self, settings: LearnerSettings, reward: Reward | None = None):
        super().__init__(settings.learner, scope=bounded_tool_calls(settings.limits))
        register_tool_host(self.registry)
        if settings.backend.backend == "openai":
            raise ConfigError("the learner updates its rollout policy: use --backend vllm, transformers or "
                              "vllm-server (openai serves fixed weights)")
        self.cfg: LearnerConfig = settings.learner
        self.grpo, self.sampler_cfg, self.backend_cfg = settings.grpo, settings.sampler, settings.backend
        self.warmup_cfg, self.limits, self.seeds = settings.warmup, settings.limits, settings.seeds
        self.fleet_cfg = settings.fleet
        self.ranks = Ranks.from_env()  # rank 0 of world_size (ranks/); the other ranks run ranks/worker.py
        self.ranks.check(settings.ranks.world_size)
        self.servers = None  # the local fleet this learner started (vllm-server without server_urls)
        self.sampling = SamplingConfig(temperature=self.grpo.temperature, max_new_tokens=self.cfg.max_new_tokens,
                                       seed=self.backend_cfg.seed)
        self.reward = reward
        self.run_id, self.resumed = run_to_continue(self.cfg)
        world = self.ranks.world_size if self.ranks.many else settings.ranks.world_size  # launched, or to launch
        if self.resumed is not None and self.resumed.world_size != world:
            raise ConfigError(f"the checkpoint at step {self.resumed.step} of run {self.run_id} holds the shards of "
                              f"{self.resumed.world_size} rank(s) and this learner has {world}: "
                              f"resume with learner.world_size={self.resumed.world_size} (a sharded checkpoint "
                              "continues at the world size that wrote it)")
        self.done = self.resumed.step if self.resumed else 0
        self.checkpointed = self.done
        self.updates_done = 0  # the trainer's updates when step `done` completed (`finish` compares)
        self.pool_state: dict[str, Any] | None = None  # the pool after the last completed step
        self.backend = self.trainer = self.pool = self.feed = self.producer = self.runner = None
        self.started = time.monotonic()
        self.blocked = 0.0
        self.last: StepOutcome | None = None
        self.telemetry = Telemetry(self.registry, self.log)

    def details(self) -> dict:
        fleet = self.backend if isinstance(self.backend, FleetBackend) else None  # each server's version
        return {"run_id": self.run_id, "step": self.done, "pool": self.pool.size if self.pool else 0,
                "world_size": self.ranks.world_size,
                **({"servers": fleet.server_versions, "servers_live": len(fleet.live_servers)} if fleet else {})}

    def start(self) -> None:
        from coevolve.services.agent.backends import make_backend

        init_group(self.ranks)
        self.pool = self._pool()
        self.backend_cfg = dataclasses.replace(self.backend_cfg, model=self.starting_policy())
        rollouts = rollout_backend(self.backend_cfg.backend, self.ranks.world_size)
        if rollouts != self.backend_cfg.backend:
            self.log.info("learner.rollouts_moved", backend=self.backend_cfg.backend, runs_as=rollouts,
                          reason="an in-process vLLM engine would join the training ranks' process group")
        self.backend = self._fleet() if rollouts == "vllm-server" else make_backend(self.backend_cfg)
        self.trainer = self._trainer()
        if self.resumed is not None:
            ckpt.restore_trainer(self.trainer, self.resumed)
            self.pool.restore(self.resumed.sampler)
            self.pool_state = self.resumed.sampler
        self.producer = EventProducer(self.cfg.kafka_bootstrap, client_id="coevolve-learner", service="learner")
        version = self._redo_journal()
        self.updates_done = self.trainer.updates
        self.runner = StepRunner(self.cfg, self.grpo, self.pool, self.backend, self.trainer, self.sampling,
                                 self.limits, self.run_id, self.reward)
        self.runner.should_stop = self._alive
        if self.done or isinstance(self.backend, FleetBackend):  # a resumed run has moved on; a fleet may be
            self.runner.push(version)  # another run's
            self.telemetry.version.set(version)
        self._follow_tasks()
        if self.cfg.resume and self.done == 0:
            self.log.info("learner.resume_fresh", workdir=str(self.cfg.workdir),
                          reason="no checkpoint or journal to resume from; starting at step 1")
        checkpointed = self.resumed.step if self.resumed is not None else 0
        self.log.info("learner.started", run_id=self.run_id, resumed_at=self.done, replayed=self.done - checkpointed,
                      model=self.backend_cfg.model, backend=self.backend_cfg.backend, pool=self.pool.size,
                      sampler=self.sampler_cfg.sampler)
        if self.done == 0 and (self.cfg.steps == 0 or self.cfg.eval_at_start):  # the starting policy, as step 0
            evaluations = evaluate_all(self.backend, self.backend_cfg, self.cfg, self.limits,
                                       self.sampling.max_new_tokens, self.run_id, 0, self.pool)
            for record in filter(None, evaluations):
                publish_evaluation(self.producer, self.run_id, record)
            self.telemetry.evaluated(0, evaluations[0])
        if self.done >= self.cfg.steps:
            self.stop()
        self.started = time.monotonic()

    def _fleet(self):
        """The rollout fleet: the servers at `server_urls`, or `servers` local ones started here."""
        from coevolve.services.agent.models import resolve_model
        from coevolve.services.fleet.servers import LocalServers

        model_dir = str(resolve_model(self.backend_cfg.model, self.backend_cfg.coevolve_home))
        urls = self.fleet_cfg.urls
        if not urls:
            self.servers = LocalServers(model_dir, self.backend_cfg, self.fleet_cfg, Path(self.cfg.workdir) / "servers")
            urls = self.servers.start().urls
            self.log.info("learner.fleet_started", servers=len(urls), urls=urls)
        return FleetBackend(urls, model_dir, self.backend_cfg, self.fleet_cfg, model_name=self.backend_cfg.model,
                            run_id=self.run_id)

    def _alive(self) -> bool:
        """Polled by the rollouts every generation round: a beat (the loop makes progress), and whether to stop."""
        self.beat()
        return self.stopping

    def _pool(self) -> TaskPool:
        """A fresh pool of the seed tasks (a resumed run restores its state after)."""
        return TaskPool(self.seeds.tasks(), self.sampler_cfg, rng_seed=self.backend_cfg.seed,
                        run_id=None if self.sampler_cfg.inherit_tasks else self.run_id)

    def starting_policy(self) -> str:
        """The model the first rollouts come from: the warmed one when the warm-up is on (`warm_up`),
        else the configured model. No broker and no trainer needed."""
        return self.warm_up() if self.warmup_cfg.warmup_steps else self.backend_cfg.model

    def warm_up(self) -> str:
        """The warmed model's directory: trained here from the configured model on first use, cached after."""
        from coevolve.services.learner.loop.warmup import warm_model

        base = self.backend_cfg.model
        path = warm_model(base, self.backend_cfg.coevolve_home, self.warmup_cfg, self.grpo, self.backend_cfg.seed,
                          self.seeds.tasks(), self.limits)  # the pool's seed tasks
        self.log.info("learner.warmed", base=base, model=str(path))
        return str(path)

    def _trainer(self):
        """The trainer over the rollout backend's starting weights; with several ranks, every rank's is built
        from them alike and rank 0 gets the driver of the others (ranks/start.py)."""
        from coevolve.services.agent.models import resolve_model

        model_dir = str(resolve_model(self.backend_cfg.model, self.backend_cfg.coevolve_home))
        pad = self.backend.tokenizer.pad_token_id
        return start_trainer(self.ranks, self.grpo, self.backend_cfg.seed,
                             {"model": model_dir, "pad_id": pad if pad is not None else 0})

    def _follow_tasks(self) -> None:
        """The task feed; in static mode it reads until the static tasks have verdicts, then the pool freezes."""
        if self.pool.frozen:  # a resumed static run
            return
        self.feed = TaskFeed(tasks_consumer(self.cfg.kafka_bootstrap), self.pool).start()
        self.watch(self.feed.failure)
        self.feed.catch_up()  # the first step draws from what the topic holds now
        if self.sampler_cfg.sampler == "static":
            self.feed.wait_for(self.run_id, 0, self.sampler_cfg.static_tasks, self.sampler_cfg.static_wait_s,
                               self._stop)  # a stop signal ends the wait early too
            self.pool.refresh(self.done + 1)
            self._report_unloadable()
            self.pool.freeze()
            self.feed.stop()
            self.log.info("learner.pool_frozen", pool=self.pool.size, synthesized=len(self.pool.synthesized))

    def _redo_journal(self) -> int:
        """Redo the journal's steps after the checkpoint (resume.py); return the policy version."""
        version = self.resumed.policy_version if self.resumed is not None else 0
        for entry, loss in redo_journaled(self.cfg.workdir, self.done, self.run_id, self.trainer, self.pool,
                                          self.producer, step_on_log(self.cfg.kafka_bootstrap)):
            self.done, version, self.pool_state = entry.step, entry.policy_version, entry.sampler
            self.telemetry.replayed.inc()
            self.beat()
            self.log.info("learner.step_replayed", step=entry.step, trained=entry.trained, loss=loss,
                          journaled_loss=entry.record.loss, trajectories=len(entry.trajectories),
                          version=version, record_was_sent=entry.published)
        return version

    def poll(self) -> None:
        """One GRPO step, journaled, published and checkpointed; stop after the last."""
        step = self.done + 1
        try:
            result = self.runner.run(step)
        except EpisodesStopped as stopped:  # nothing of this step was journaled or published; a resume redoes it
            self.log.info("learner.step_abandoned", step=step, reason=str(stopped))
            return
        except (FleetError, WeightTransferError) as failed:  # nothing of it published: --resume redoes it
            self.telemetry.failed(step, failed, "bring the servers back (local ones log under <workdir>/servers)")
            raise
        finally:
            self._report_unloadable()  # tasks the pool refused as they arrived, or the step's draws dropped
        record, evaluation, subjects = result.record, None, None
        if due(self.cfg, step):
            evaluation, subjects = evaluate_all(self.backend, self.backend_cfg, self.cfg, self.limits,
                                                self.sampling.max_new_tokens, self.run_id, step, self.pool)
            record = record.evaluated(evaluation["success_rate"])
        started = time.perf_counter()
        sampler = result.pool_state
        path = journal.write(self.cfg.workdir, journal.Entry(
            step, self.run_id, result.trained, result.batch, result.trajectories, evaluation, record,
            self.backend.version, self.trainer.updates, sampler, policy_update=result.policy_update,
            subjects=subjects))
        try:
            record = publish_journaled(self.producer, self.run_id, path, result.trajectories, [evaluation, subjects],
                                       record, started, result.policy_update, self.beat)
        except DeliveryError as failed:  # past the outage allowance: --resume replays the step and publishes it
            self.telemetry.failed(step, failed, "bring the broker back")
            raise
        self.done, self.last, self.pool_state = step, dataclasses.replace(result, record=record), sampler
        self.updates_done = self.trainer.updates
        self.blocked += record.blocked_seconds
        if result.policy_update is not None:
            self.telemetry.pushed(result.policy_update)
        self.telemetry.stepped(record, evaluation, self.blocked_share,
                             self.trainer.rank_times if self.ranks.many and record.tokens_trained else [])
        self.beat()
        if step % self.cfg.checkpoint_every == 0 or step >= self.cfg.steps:
            self._checkpoint()
        if step >= self.cfg.steps:
            self.stop()

    def _report_unloadable(self) -> None:
        report_unloadable(self.pool, self.producer, self.telemetry, self.log, self.name)

    @property
    def blocked_share(self) -> float:
        return self.blocked / max(time.monotonic() - self.started, 1e-9)

    def _checkpoint(self) -> None:
        configs = {name: dataclasses.asdict(c) for name, c in (
            ("learner", self.cfg), ("grpo", self.grpo), ("sampler", self.sampler_cfg), ("warmup", self.warmup_cfg),
            ("backend", self.backend_cfg))}
        sampler = self.pool_state if self.pool_state is not None else self.pool.state()
        path = ckpt.save_checkpoint(self.cfg.workdir, self.trainer, step=self.done, run_id=self.run_id,
                                    world_size=self.ranks.world_size, policy_version=self.backend.version,
                                    sampler=sampler, config=configs, keep=self.cfg.keep_checkpoints)
        journal.prune(self.cfg.workdir, self.done)
        self.checkpointed = self.done
        self.log.info("learner.checkpointed", step=self.done, path=str(path))

    def finish(self) -> None:
        try:
            broken = isinstance(self.trainer, Driver) and self.trainer.broken  # ranks out of step
            if self.trainer is not None and self.done > self.checkpointed and not broken:
                if self.trainer.updates == self.updates_done:
                    self._checkpoint()
                else:  # a step failed after its update: the weights are no longer step `done`'s
                    self.log.warning("learner.checkpoint_skipped", step=self.done, updates=self.trainer.updates,
                                     updates_at_step=self.updates_done, resume=f"replays the journal after step "
                                     f"{self.checkpointed}, up to the last step it holds")
        finally:
            if isinstance(self.trainer, Driver):
                self.trainer.close()
            if self.runner is not None:
                self.runner.close()
            if self.feed is not None:
                self.feed.stop()
            for closable in (self.producer, self.backend):
                if closable is not None:
                    closable.close()
            if self.servers is not None:
                self.servers.stop()
            self.log.info("learner.finished", run_id=self.run_id, step=self.done,
                          blocked_share=round(self.blocked_share, 6))
