"""`coevolve explorer`: signals in, `ExplorationRecorded` out (a runtime.Service).

It reads `coevolve.signals` and `coevolve.steps` in one consumer group. Signals gather in a
`SignalBuffer`; a period closes `step_grace_s` after its last step's `StepCompleted` (or after
`step_window_s`), and its plan is explored (`exploring.explore_plan`) while the consumer keeps its
group (`EventConsumer.working`). The explorations are published and confirmed, a cluster whose
reflection never parsed goes to the dead-letter topic with the reason, and only then are the offsets
committed, each partition up to the oldest record an open period still holds (its signals, the
`StepCompleted` that made it due; `Holds`), so a long backlog commits as it is worked off: a crash
re-delivers what was not yet explored, and the deterministic exploration ids let consumers drop what was
published twice.

A signal may name a task the loop made: the explorer keeps the catalog of validated tasks (`TaskCatalog`,
read from `coevolve.tasks` at start and again whenever a signal names an id it does not know).
"""
from __future__ import annotations

import dataclasses
import time

from prometheus_client import Counter

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.envs.catalog import TaskCatalog
from coevolve.services.envs.hosts import bounded_tool_calls, register_tool_host
from coevolve.services.explorer.config import ExplorerServiceConfig, ExplorerSettings
from coevolve.services.explorer.exploring import Budget, Outcome, explore_plan, explore_static
from coevolve.services.explorer.planning import Plan, SignalBuffer
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.holds import Holds
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import EXPLORATIONS, SIGNALS, STEPS, TASKS
from coevolve.services.runtime.service import Service


class Explorer(Service):
    """Gather signals, explore each closed period, publish, then commit."""

    name = "explorer"

    def __init__(self, settings: ExplorerSettings):
        super().__init__(settings.service, scope=bounded_tool_calls(settings.limits))
        register_tool_host(self.registry)
        cfg, gen = settings.service, settings.generation
        self.cfg: ExplorerServiceConfig = cfg
        self.core, self.seeds, self.backend_cfg = settings.explorer, settings.seeds, settings.backend
        self.buffer = SignalBuffer(self.core)
        self.holds = Holds()
        self.sampling = SamplingConfig(temperature=gen.temperature, max_new_tokens=gen.max_new_tokens,
                                       seed=self.backend_cfg.seed)
        self.json_sampling = dataclasses.replace(self.sampling, max_new_tokens=gen.json_max_new_tokens)
        self.budget = Budget(cfg.max_runs_per_period, cfg.max_tokens_per_period, cfg.max_seconds_per_period)
        self.limits = settings.limits
        self.delivered: dict = {}
        self.backend = self.consumer = self.producer = self.catalog_reader = None
        self.catalog = TaskCatalog()
        self.task_ids: list[str] = []
        self.uncommitted = 0
        self.last_event = time.monotonic()
        self._metrics()

    def _metrics(self) -> None:
        def counter(name, text, labels=()):
            return Counter(f"explorer_{name}", text, list(labels), registry=self.registry)

        self.m_signals = counter("signals_consumed", "SignalRaised events gathered (redeliveries excluded).")
        self.m_skipped = counter("signals_skipped", "Signals not explored, by why: priority (beyond "
                                 "signals_per_step), budget (a period limit), kind (not in signal_kinds).", ["why"])
        self.m_explorations = counter("explorations", "ExplorationRecorded events published.", ["strategy"])
        self.m_dead = counter("dead_letters", "Clusters dead-lettered (reflection unparseable or no task).")
        self.m_runs = counter("runs", "Exploration runs made.")
        self.m_calls = counter("calls", "Tool calls made in exploration runs.")
        self.m_tokens = counter("tokens", "Tokens (prompt and completion) of reflections and exploration calls.")
        self.m_unusable = counter("unusable_calls", "Model answers that never fit the call schema (each ends "
                                  "its exploration run).")
        self.m_plans = counter("periods", "Periods closed and explored, by what closed them.", ["closed_by"])
        self.m_fallbacks = counter("fallbacks", "Periods that explored fallback_tasks seed tasks because no "
                                   "signal was explored.")

    def details(self) -> dict:
        return {"pending_signals": self.buffer.pending, "strategy": self.core.strategy}

    def start(self) -> None:
        from coevolve.services.agent.backends import make_backend

        cfg = self.cfg
        self.task_ids = [t.task_id for t in self.seeds.tasks()]
        if self.core.strategy in ("signal-guided", "random"):  # random-calls and static read no model
            self.backend = make_backend(self.backend_cfg)
        self.catalog_reader = EventConsumer(cfg.kafka_bootstrap, [TASKS.name], service="explorer-catalog")
        self.catalog = TaskCatalog(self.catalog_reader)
        self.catalog.refresh()
        self.producer = EventProducer(cfg.kafka_bootstrap, client_id="coevolve-explorer", service="explorer")
        self.consumer = EventConsumer(cfg.kafka_bootstrap, [SIGNALS.name, STEPS.name], group_id=cfg.group(self.name),
                                      service="explorer", deadletters=self.producer)
        self.log.info("explorer.started", bootstrap=cfg.kafka_bootstrap, strategy=self.core.strategy,
                      model=self.backend_cfg.model, backend=self.backend_cfg.backend,
                      validated_tasks=len(self.catalog))
        if self.core.strategy == "static":
            self._publish([self._explore(Plan(cfg.run_id, 0, 0, (), 0, 0, "start"))])
        self.last_event = time.monotonic()

    def poll(self) -> None:
        """Poll once, gather, explore the periods that closed, publish, and commit up to what open periods hold."""
        items = self.consumer.poll(0.5, self.cfg.poll_records)  # bounded: a backlog is worked off in batches
        self.beat()
        plans: list[Plan] = []
        buffer = self.buffer
        for item in items:
            if item.name == "SignalRaised":
                if buffer.add(item.event, time.monotonic()):
                    self.m_signals.inc()
                    self.delivered[str(item.event["event_id"])] = item
                    self.holds.hold(buffer.key_of(str(item.event["run_id"]), int(item.event["step"])), item)
            elif item.name == "StepCompleted":
                run_id, step = str(item.event["run_id"]), int(item.event["step"])
                plans += buffer.step_completed(run_id, step, time.monotonic())
                for key in buffer.due_keys(run_id, step):
                    self.holds.hold(key, item)
            else:
                self.consumer.reject(item, "invalid", f"expected SignalRaised or StepCompleted, got {item.name}")
        plans += self.buffer.expire(time.monotonic())
        if items or plans or not self.consumer.assigned():
            self.last_event = self.last_beat
        outcomes: list[Outcome] = []
        if plans:
            with self.consumer.working():  # model work outlasts the poll interval; keep the group
                for plan in plans:  # several periods closed at once after downtime: a beat after each
                    outcomes.append(self._explore(plan))
                    self.beat()
        for plan in plans:
            self.holds.release(buffer.key_of(plan.run_id, plan.first_step))
        self.uncommitted += len(items)
        if self.uncommitted or outcomes:
            self.settle(lambda: self._publish(outcomes), self._commit, self.uncommitted)
            self.uncommitted = 0
        idle = time.monotonic() - self.last_event
        if self.cfg.idle_exit_seconds and not self.buffer.waiting and idle >= self.cfg.idle_exit_seconds:
            self.stop()

    def _explore(self, plan: Plan) -> Outcome:
        self.m_plans.labels(plan.closed_by).inc()
        self.m_skipped.labels("priority").inc(plan.skipped)
        self.m_skipped.labels("kind").inc(plan.ignored)
        model = self.backend_cfg.model if self.backend is not None else ""
        if plan.closed_by == "start":  # the static strategy's one exploration
            out = explore_static(plan, self.core, self.budget, self.task_ids)
        else:
            out = explore_plan(plan, self.backend, self.core, self.sampling, self.budget, model, self.task_ids,
                               self.catalog, self.limits, json_sampling=self.json_sampling)
        self.m_skipped.labels("budget").inc(out.over_budget)
        self.m_runs.inc(out.runs)
        self.m_calls.inc(out.calls)
        self.m_tokens.inc(out.tokens)
        self.m_unusable.inc(out.unusable)
        self.m_fallbacks.inc(out.fell_back)
        self.log.info("explorer.period", run_id=plan.run_id, steps=[plan.first_step, plan.last_step],
                      closed_by=plan.closed_by, clusters=len(plan.chosen), skipped=plan.skipped,
                      explorations=len(out.records), dead_lettered=len(out.rejected), tokens=out.tokens,
                      calls=out.calls, replayed=out.replayed, unusable=out.unusable, fell_back=out.fell_back)
        return out

    def _publish(self, outcomes: list[Outcome]) -> None:
        """Send every exploration and dead letter, and wait until the broker has them all."""
        for out in outcomes:
            for record in out.records:
                self.producer.send(EXPLORATIONS.name, record, key=record["task_id"])
                self.m_explorations.labels(record["strategy"]).inc()
            for cluster, error_type, reason in out.rejected:
                for signal_id in cluster.signal_ids:
                    item = self.delivered.get(signal_id)
                    if item is not None:
                        self.consumer.reject(item, error_type, reason)
                self.m_dead.inc()
        self.producer.flush()

    def _commit(self) -> bool:
        """Commit everything polled but what an open period holds: the rest has been explored or
        dead-lettered."""
        committed, self.delivered = self.holds.commit(self.consumer, self.delivered)  # an open period's may fail
        return committed

    def finish(self) -> None:
        for closable in (self.consumer, self.catalog_reader, self.producer, self.backend):
            if closable is not None:
                closable.close()
