"""`coevolve learner`: GRPO steps on the streaming task pool, published as events (a runtime.Service).

Each `step()` of the service loop is one GRPO step: take arrived tasks into the pool (the only
time the learner waits on the loop), run the step (`step.StepRunner`), evaluate when due, write
the step's journal entry (`journal.py`: the batch the update trained on, the records to publish, the
pool's state after the step), then publish every trajectory, the `EvaluationCompleted` if any, and
the `StepCompleted`, each batch confirmed by the broker before the next, and checkpoint every
`checkpoint_every` steps; a checkpoint prunes the journal up to its step. A SIGTERM or SIGINT stops
the loop at the next step boundary; `finish()` checkpoints the last completed step.

Resuming. Event ids derive from (run, step, task, rollout), and consumers keep the first copy of an
id, so a step that published before a crash must never be re-run: its rollouts and update would
differ from what was published. `--resume` restores the latest checkpoint c and then replays every
journal entry c+1..k in order, without rollouts: the same `engine.update` on the journaled batch
(so the weights, the optimizer state and `engine.updates` follow the path they took, with DeepSpeed and
LoRA alike), the pool's state after the step, and the step's records sent again as journaled (same
ids and content, which also completes a publish the crash cut short; the evaluation is sent as it
was, never re-run). The weights are pushed to the rollout backend once, after the last entry, with
the policy version that entry recorded; training continues at k+1. A step that crashed before its
entry was renamed into place published nothing and is run afresh. Without a checkpoint, the replay
starts from the starting weights.

Unloadable tasks. A task whose episode cannot start (BFCL's `InvalidTask`) is refused by the pool when
it arrives, or dropped when first drawn and replaced by another draw (sampler.py); the learner
dead-letters an arrival (`task_unloadable` on coevolve.deadletter, the TaskChecked bytes kept), logs
`learner.task_unloadable`, counts `learner_tasks_unloadable`, and trains on.
"""
from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.episodes import EpisodesStopped
from coevolve.services.fleet.backend import FleetError, WeightTransferError
from coevolve.services.kafka.topics import DEADLETTER, EVALUATIONS, POLICY, STEPS, TASKS, TRAJECTORIES
from coevolve.services.learner import checkpoint as ckpt
from coevolve.services.learner import journal
from coevolve.services.learner.config import LearnerConfig, LearnerSettings, rollout_backend
from coevolve.services.learner.evaluation import due, evaluate, evaluate_subjects
from coevolve.services.learner.ranks import Driver, Ranks, complete, init_group, share
from coevolve.services.learner.sampler import TaskFeed, TaskPool
from coevolve.services.learner.record import PHASES, StepRecord
from coevolve.services.learner.step import Reward, StepResult, StepRunner
from coevolve.services.runtime.config import ConfigError
from coevolve.services.runtime.service import Service


def resolve_run(cfg: LearnerConfig) -> tuple[str, ckpt.Checkpoint | None]:
    """The run id and the checkpoint to continue from; refuse to overwrite a run without --resume. A
    journal without a checkpoint (a crash before the first one) is a run to resume too."""
    found = ckpt.latest_checkpoint(cfg.workdir)
    journaled = journal.run_of(cfg.workdir) if found is None else None
    existing = found.run_id if found is not None else journaled
    if existing is not None and not cfg.resume:
        holds = (f"a checkpoint of run {found.run_id} at step {found.step}" if found is not None
                 else f"a step journal of run {journaled}")
        raise ConfigError(f"{cfg.workdir} holds {holds}; pass --resume to continue it, or choose another --workdir")
    if existing is not None:
        if cfg.run_id and cfg.run_id != existing:
            raise ConfigError(f"--run-id {cfg.run_id} differs from the run {existing} in {cfg.workdir}; "
                              "drop --run-id to resume it")
        return existing, found
    return cfg.run_id or datetime.now(timezone.utc).strftime("run-%Y%m%dT%H%M%SZ"), None


class Learner(Service):
    """The GRPO learner; `run()` returns after step `cfg.steps` or a stop signal."""

    name = "learner"
    commits = False  # it consumes no offsets: the task feed rereads its compacted topic at every start
    stale_s = 3600.0  # a CPU step can take minutes; the loop beats once per step

    def __init__(self, settings: LearnerSettings, reward: Reward | None = None):
        super().__init__(settings.learner)
        if settings.backend.backend == "openai":
            raise ConfigError("the learner updates its rollout policy: use --backend vllm, transformers or "
                              "vllm-server (openai serves fixed weights)")
        self.cfg: LearnerConfig = settings.learner
        self.grpo, self.sampler_cfg, self.backend_cfg = settings.grpo, settings.sampler, settings.backend
        self.warmup, self.limits, self.seeds = settings.warmup, settings.limits, settings.seeds
        self.fleet_cfg = settings.fleet
        self.ranks = Ranks.from_env()  # rank 0 of world_size (ranks.py); the other ranks run worker.py
        self.ranks.check(settings.ranks.world_size)
        self.servers = None  # the local fleet this learner started (vllm-server without server_urls)
        self.sampling = SamplingConfig(temperature=self.grpo.temperature, max_new_tokens=self.cfg.max_new_tokens,
                                       seed=self.backend_cfg.seed)
        self.reward = reward
        self.run_id, self.resumed = resolve_run(self.cfg)
        world = self.ranks.world_size if self.ranks.many else settings.ranks.world_size  # launched, or to launch
        if self.resumed is not None and self.resumed.world_size != world:
            raise ConfigError(f"the checkpoint at step {self.resumed.step} of run {self.run_id} holds the shards of "
                              f"{self.resumed.world_size} rank(s) and this learner has {world}: "
                              f"resume with learner.world_size={self.resumed.world_size} (a sharded checkpoint "
                              "continues at the world size that wrote it)")
        self.done = self.resumed.step if self.resumed else 0
        self.checkpointed = self.done
        self.pool_state: dict[str, Any] | None = None  # the pool after the last completed step
        self.backend = self.engine = self.pool = self.feed = self.producer = self.runner = None
        self.started = time.monotonic()
        self.blocked = 0.0
        self.last: StepResult | None = None
        self._metrics()

    def _metrics(self) -> None:
        reg = self.registry
        self.m_steps = Counter("learner_steps", "Training steps completed and published.", registry=reg)
        self.m_trajectories = Counter("learner_trajectories", "Trajectories published.", registry=reg)
        self.m_reward = Gauge("learner_train_reward", "Mean rollout reward of the last step.", registry=reg)
        self.m_eval = Gauge("learner_eval_success_rate", "Held-out success rate at the last evaluation.",
                            registry=reg)
        self.m_version = Gauge("learner_policy_version", "Policy version in the rollout engine.", registry=reg)
        self.m_pool = Gauge("learner_pool_tasks", "Tasks in the sampler's pool, by source.", ["source"], registry=reg)
        self.m_step_s = Histogram("learner_step_seconds", "Wall time of a training step.", registry=reg,
                                  buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600))
        self.m_phase = Counter("learner_phase_seconds", "Seconds spent per phase of the steps.", ["phase"],
                               registry=reg)
        self.m_blocked = Gauge("learner_blocked_share", "Share of wall time blocked on the loop (taking tasks in).",
                               registry=reg)
        self.m_replayed = Counter("learner_steps_replayed", "Journaled steps replayed at a resume.", registry=reg)
        self.m_pushes = Counter("learner_weight_updates", "Weight updates pushed into the rollout engine.",
                                registry=reg)
        self.m_push_s = Histogram("learner_weight_update_seconds", "Wall time of one weight push.", registry=reg,
                                  buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120))
        self.m_behind = Gauge("learner_servers_behind", "Fleet servers a failed transfer left on an older policy.",
                              registry=reg)
        self.m_rank_s = Gauge("learner_rank_seconds", "Seconds of each rank's part of the last update, by phase "
                              "(training: forward and backward; reduce: the optimizer step and the collectives "
                              "outside the backward).", ["rank", "phase"], registry=reg)
        self.m_unloadable = Counter("learner_tasks_unloadable", "Tasks refused or dropped from the pool because "
                                    "their episodes cannot start.", registry=reg)

    def details(self) -> dict:
        fleet = getattr(self.backend, "server_versions", None)  # the rollout fleet: each server's version
        return {"run_id": self.run_id, "step": self.done, "pool": self.pool.size if self.pool else 0,
                "world_size": self.ranks.world_size,
                "feed_error": self.feed.error if self.feed else None,
                **({"servers": fleet, "servers_live": len(self.backend.live_servers)} if fleet is not None else {})}

    def start(self) -> None:
        from coevolve.services.agent.backends import make_backend
        from coevolve.services.kafka.producer import EventProducer

        init_group(self.ranks)
        self.pool = self._pool()
        self.backend_cfg = dataclasses.replace(self.backend_cfg, model=self.starting_policy())
        rollouts = rollout_backend(self.backend_cfg.backend, self.ranks.world_size)
        if rollouts != self.backend_cfg.backend:
            self.log.info("learner.rollouts_moved", backend=self.backend_cfg.backend, runs_as=rollouts,
                          reason="an in-process vLLM engine would join the training ranks' process group")
        self.backend = self._fleet() if rollouts == "vllm-server" else make_backend(self.backend_cfg)
        self.engine = self._engine()
        if self.resumed is not None:
            ckpt.restore_engine(self.engine, self.resumed)
            self.pool.restore(self.resumed.sampler)
            self.pool_state = self.resumed.sampler
        self.producer = EventProducer(self.cfg.kafka_bootstrap, client_id="coevolve-learner")
        version = self._replay()
        if self.done:  # the backend serves the starting weights; a resumed run has moved on
            self.backend.update_weights(self.engine.named_parameters(), version=version)
            self.m_version.set(version)
        self.runner = StepRunner(self.cfg, self.grpo, self.pool, self.backend, self.engine, self.sampling,
                                 self.limits, self.run_id, self.reward)
        self.runner.should_stop = lambda: self.stopping
        self._follow_tasks()
        if self.cfg.resume and self.done == 0:
            self.log.info("learner.resume_fresh", workdir=str(self.cfg.workdir),
                          reason="no checkpoint or journal to resume from; starting at step 1")
        checkpointed = self.resumed.step if self.resumed is not None else 0
        self.log.info("learner.started", run_id=self.run_id, resumed_at=self.done, replayed=self.done - checkpointed,
                      model=self.backend_cfg.model, backend=self.backend_cfg.backend, pool=self.pool.size,
                      sampler=self.sampler_cfg.sampler)
        if self.cfg.steps == 0:
            self._evaluate_only()
        if self.done >= self.cfg.steps:
            self.stop()
        self.started = time.monotonic()

    def _fleet(self):
        """The rollout fleet: the servers at `server_urls`, or `servers` local ones started here."""
        from coevolve.services.agent.models import resolve_model
        from coevolve.services.fleet.backend import FleetBackend
        from coevolve.services.fleet.servers import LocalServers

        model_dir = str(resolve_model(self.backend_cfg.model, self.backend_cfg.coevolve_home))
        urls = self.fleet_cfg.urls
        if not urls:
            self.servers = LocalServers(model_dir, self.backend_cfg, self.fleet_cfg, Path(self.cfg.workdir) / "servers")
            urls = self.servers.start().urls
            self.log.info("learner.fleet_started", servers=len(urls), urls=urls)
        return FleetBackend(urls, model_dir, self.backend_cfg, self.fleet_cfg, model_name=self.backend_cfg.model)

    def _observe_push(self, record: dict[str, Any]) -> None:
        """Count and log a step's push from its `PolicyUpdated` record."""
        self.m_pushes.inc()
        self.m_push_s.observe(record["seconds"])
        self.m_behind.set(record["servers_behind"])
        self.log.info("learner.policy_updated", version=record["version"], seconds=round(record["seconds"], 3),
                      bytes=record["bytes"], servers=record["servers"], servers_behind=record["servers_behind"])

    def _evaluate_only(self) -> None:
        """steps = 0 (the zero-shot arm): evaluate the starting policy once, as step 0, and publish it."""
        evaluation = evaluate(self.backend, self.backend_cfg, self.cfg, self.limits, self.sampling.max_new_tokens,
                              self.run_id, 0)
        self.producer.send(EVALUATIONS.name, evaluation, key=self.run_id)
        self.producer.flush()
        self.m_eval.set(evaluation["success_rate"])
        self.log.info("learner.evaluated", step=0, success_rate=evaluation["success_rate"],
                      mean_score=evaluation["mean_score"], tasks=evaluation["task_count"])

    def _pool(self) -> TaskPool:
        """A fresh pool of the seed tasks (a resumed run restores its state after)."""
        return TaskPool(self.seeds.tasks(), self.sampler_cfg, seed=self.backend_cfg.seed)

    def starting_policy(self) -> str:
        """The model the first rollouts come from: the warmed one when the warm-up is on (`warm_up`),
        else the configured model. No broker and no engine needed."""
        return self.warm_up() if self.warmup.warmup_steps else self.backend_cfg.model

    def warm_up(self) -> str:
        """The warmed model's directory: trained here from the configured model on first use, cached after."""
        from coevolve.services.learner.warmup import warm_model

        base = self.backend_cfg.model
        tasks = list({t.task_id: t for t in self.seeds.tasks()}.values())  # the pool's seed tasks
        path = warm_model(base, self.backend_cfg.coevolve_home, self.warmup, self.grpo, self.backend_cfg.seed,
                          tasks, self.limits)
        self.log.info("learner.warmed", base=base, model=str(path))
        return str(path)

    def _engine(self):
        """The engine over the rollout backend's starting weights, on the GPU where there is one, prepared
        for `self.grpo` (build_engine). With several ranks every rank builds its own from the same
        weights (told here where they are), and rank 0 drives them (ranks.Driver)."""
        from coevolve.services.agent.models import resolve_model
        from coevolve.services.agent.precision import default_device
        from coevolve.services.learner.engines import load_engine

        model_dir = str(resolve_model(self.backend_cfg.model, self.backend_cfg.coevolve_home))
        pad = self.backend.tokenizer.pad_token_id
        start = share({"model": model_dir, "pad_id": pad if pad is not None else 0})
        device = self.ranks.device() if self.ranks.many else default_device()
        engine = load_engine(start["model"], self.grpo, start["pad_id"], self.backend_cfg.seed, device)
        if not self.ranks.many:
            return engine
        complete()  # every rank has its engine before rank 0 drives them
        return Driver(engine)

    def _follow_tasks(self) -> None:
        """Start the task feed; in static mode read for `static_wait_s`, take the tasks in, then freeze."""
        from coevolve.services.kafka.consumer import EventConsumer
        from coevolve.services.kafka.producer import EventProducer

        if self.pool.frozen:
            return

        def consumer() -> EventConsumer:
            deadletters = EventProducer(self.cfg.kafka_bootstrap, client_id="coevolve-learner-feed")
            return EventConsumer(self.cfg.kafka_bootstrap, [TASKS.name], service="learner", deadletters=deadletters)

        self.feed = TaskFeed(consumer, self.pool).start()
        if self.sampler_cfg.sampler == "static":
            self._stop.wait(self.sampler_cfg.static_wait_s)  # a stop signal ends the wait early
            self.pool.refresh(self.done + 1)
            self._report_unloadable()
            self.pool.freeze()
            self.feed.stop()
            self.log.info("learner.pool_frozen", pool=self.pool.size, synthesized=len(self.pool.synthesized))

    def _replay(self) -> int:
        """Replay the journal after the checkpoint (the module docstring); return the policy version."""
        version = self.resumed.policy_version if self.resumed is not None else 0
        for path in journal.entries_after(self.cfg.workdir, self.done):
            entry = journal.read(path)
            if entry.run_id != self.run_id:
                raise ConfigError(f"{path} is a step of run {entry.run_id}, not of {self.run_id}; move the "
                                  "journal away, or choose another --workdir")
            loss = self.engine.update(entry.batch)["loss"] if entry.trained else None
            if self.engine.updates != entry.engine_updates:
                raise RuntimeError(f"{path} was journaled after engine update {entry.engine_updates}, its replay "
                                   f"reached {self.engine.updates}: the journal does not continue the checkpoint")
            self.pool.restore(entry.sampler)
            self._publish(path, entry.trajectories, [entry.evaluation, entry.subjects], entry.record,
                          published=entry.published, policy_update=entry.policy_update)
            self.done, version, self.pool_state = entry.step, entry.policy_version, entry.sampler
            self.m_replayed.inc()
            self.beat()
            self.log.info("learner.step_replayed", step=entry.step, trained=entry.trained, loss=loss,
                          journaled_loss=entry.record.loss, trajectories=len(entry.trajectories),
                          version=version, record_was_sent=entry.published)
        return version

    def step(self) -> None:
        """One GRPO step, journaled, published and checkpointed; stop after the last."""
        step = self.done + 1
        try:
            result = self.runner.run(step)
        except EpisodesStopped as stopped:  # nothing of this step was journaled or published; a resume redoes it
            self.log.info("learner.step_abandoned", step=step, reason=str(stopped))
            return
        except (FleetError, WeightTransferError) as failed:  # nothing of it published: --resume redoes it
            self.log.error("learner.step_failed", step=step, reason=str(failed),
                           fix="bring the servers back (their logs are under <workdir>/servers for local ones), "
                               "then rerun with --resume")
            raise
        finally:
            self._report_unloadable()  # tasks the pool refused as they arrived, or the step's draws dropped
        record, evaluation, subjects = result.record, None, None
        if due(self.cfg, step):
            evaluation = evaluate(self.backend, self.backend_cfg, self.cfg, self.limits,
                                  self.sampling.max_new_tokens, self.run_id, step)
            record = record.evaluated(evaluation["success_rate"])
            if self.cfg.eval_subjects:
                with self.pool.guard:
                    tasks = self.pool.subject_tasks()
                subjects = evaluate_subjects(self.backend, self.backend_cfg, tasks, self.cfg, self.limits,
                                             self.sampling.max_new_tokens, self.run_id, step)
        started = time.perf_counter()
        sampler = result.pool_state
        path = journal.write(self.cfg.workdir, journal.Entry(
            step, self.run_id, result.trained, result.batch, result.trajectories, evaluation, record,
            self.backend.version, self.engine.updates, sampler, policy_update=result.policy_update,
            subjects=subjects))
        record = self._publish(path, result.trajectories, [evaluation, subjects], record, started=started,
                               policy_update=result.policy_update)
        self.done, self.last, self.pool_state = step, dataclasses.replace(result, record=record), sampler
        self.blocked += record.blocked_seconds
        if result.policy_update is not None:
            self._observe_push(result.policy_update)
        self._observe(record, evaluation)
        self.beat()
        if step % self.cfg.checkpoint_every == 0 or step >= self.cfg.steps:
            self._checkpoint()
        if step >= self.cfg.steps:
            self.stop()

    def _publish(self, path: Path, trajectories: list[dict[str, Any]], evaluations: list[dict[str, Any] | None],
                 record: StepRecord, published: bool = False, started: float | None = None,
                 policy_update: dict[str, Any] | None = None) -> StepRecord:
        """Trajectories first, confirmed; then the policy update, the evaluations (held-out, subjects) and
        the step record, which is returned.

        A step record not sent before gets its publish time (since `started`: the journal write
        counts) and is kept in the journal entry at `path` before it is sent, so a replay sends this
        one; a record `published` before is sent as it is."""
        started = time.perf_counter() if started is None else started
        for trajectory in trajectories:
            self.producer.send(TRAJECTORIES.name, trajectory, key=trajectory["task_id"])
        self.producer.flush()
        if not published:
            record = record.published(time.perf_counter() - started)
            journal.mark_published(path, record)
        if policy_update is not None:
            self.producer.send(POLICY.name, policy_update, key=self.run_id)
        for evaluation in evaluations:
            if evaluation is not None:
                self.producer.send(EVALUATIONS.name, evaluation, key=self.run_id)
        self.producer.send(STEPS.name, record.to_event(), key=self.run_id)
        self.producer.flush()
        return record

    def _report_unloadable(self) -> None:
        """Dead-letter (an arrival from coevolve.tasks), log and count each task the pool refused or dropped."""
        from coevolve.services.kafka.consumer import dead_letter

        sent = False
        with self.pool.guard:
            unloadable = self.pool.take_unloadable()
        for bad in unloadable:
            self.m_unloadable.inc()
            self.log.warning("learner.task_unloadable", task_id=bad.task_id, reason=bad.reason,
                             dead_lettered=bad.origin is not None)
            if bad.origin is None:  # a seed or restored task: no event to dead-letter
                continue
            where = bad.origin
            payload = self.producer.registry.encode("TaskChecked", bad.record)
            self.producer.send(DEADLETTER.name, dead_letter(where.topic, where.partition, where.offset, where.key,
                                                            payload, "task_unloadable", bad.reason, self.name),
                               key=where.topic)
            sent = True
        if sent:
            self.producer.flush()

    def _observe(self, rec: StepRecord, evaluation: dict[str, Any] | None) -> None:
        self.m_steps.inc()
        self.m_trajectories.inc(rec.trajectory_count)
        self.m_reward.set(rec.train_reward)
        self.m_version.set(rec.policy_version)
        self.m_pool.labels("seed").set(rec.pool_size - rec.pool_synthesized)
        self.m_pool.labels("synthesized").set(rec.pool_synthesized)
        self.m_step_s.observe(rec.duration_seconds)
        for phase in PHASES:
            self.m_phase.labels(phase).inc(getattr(rec, f"{phase}_seconds") or 0.0)
        self.m_blocked.set(self.blocked_share)
        if evaluation is not None:
            self.m_eval.set(evaluation["success_rate"])
        self.log.info("learner.step", step=rec.step, reward=round(rec.train_reward, 4), loss=rec.loss,
                      trajectories=rec.trajectory_count, pool=rec.pool_size, synthesized=rec.pool_synthesized,
                      version=rec.policy_version, seconds=round(rec.duration_seconds, 2), eval_success=rec.eval_success,
                      **self._rank_split(rec))

    def _rank_split(self, rec: StepRecord) -> dict[str, Any]:
        """With several ranks: each rank's seconds by phase (rollout and push are rank 0's: it generates and
        sends, the others wait) and the slowest rank of the update; nothing with one rank or no update."""
        times = self.engine.rank_times if self.ranks.many and rec.tokens_trained else []
        for rank, own in enumerate(times):
            for phase, seconds in own.items():
                self.m_rank_s.labels(str(rank), phase).set(seconds)
        if not times:
            return {}
        split = [{"rank": rank, "rollout": round(rec.rollout_seconds if rank == 0 else 0.0, 3),
                  "training": round(own["training"], 3), "reduce": round(own["reduce"], 3),
                  "push": round((rec.push_seconds or 0.0) if rank == 0 else 0.0, 3)} for rank, own in enumerate(times)]
        slowest = max(range(len(times)), key=lambda r: times[r]["training"] + times[r]["reduce"])
        return {"slowest_rank": slowest, "ranks": split}

    @property
    def blocked_share(self) -> float:
        return self.blocked / max(time.monotonic() - self.started, 1e-9)

    def _checkpoint(self) -> None:
        configs = {name: dataclasses.asdict(c) for name, c in (("learner", self.cfg), ("grpo", self.grpo),
                                                                 ("sampler", self.sampler_cfg),
                                                                 ("warmup", self.warmup),
                                                                 ("backend", self.backend_cfg))}
        path = ckpt.save_checkpoint(self.cfg.workdir, self.engine, step=self.done, run_id=self.run_id,
                                    world_size=self.ranks.world_size,
                                    policy_version=self.backend.version,
                                    sampler=self.pool_state if self.pool_state is not None else self.pool.state(),
                                    config=configs, keep=self.cfg.keep_checkpoints)
        journal.prune(self.cfg.workdir, self.done)
        self.checkpointed = self.done
        self.log.info("learner.checkpointed", step=self.done, path=str(path))

    def finish(self) -> None:
        try:
            if self.engine is not None and self.done > self.checkpointed and not getattr(self.engine, "broken", False):
                self._checkpoint()
        finally:
            if isinstance(self.engine, Driver):
                self.engine.close()
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
