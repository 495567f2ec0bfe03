"""`coevolve explorer`: signals in, `ExplorationRecorded` out (a runtime.Service).

It reads `coevolve.signals` and `coevolve.steps` in one consumer group. Signals gather in a
`SignalBuffer`; a period closes `step_grace_s` after its last step's `StepCompleted` (or after
`step_window_s`), and its plan is explored (`exploring.explore_plan`) while the consumer keeps its
group (`EventConsumer.working`). The explorations are published and confirmed, a cluster whose
reflection never parsed goes to the dead-letter topic with the reason, and only then are the offsets
committed, and only while no period is open: a crash re-delivers what was not yet explored, and the
deterministic exploration ids let consumers drop what was published twice.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from prometheus_client import Counter

from coevolve.services.agent.config import BackendConfig, EpisodeLimits, SamplingConfig
from coevolve.services.explorer.config import ExplorerConfig
from coevolve.services.explorer.exploring import Budget, Outcome, explore_plan, explore_static
from coevolve.services.explorer.planning import Plan, SignalBuffer
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import EXPLORATIONS, SIGNALS, STEPS
from coevolve.services.runtime.config import ConfigError, doc
from coevolve.services.runtime.service import Service

@dataclass(frozen=True)
class ExplorerServiceConfig:
    """Broker, group, sampling, per-period limits and metrics of the explorer service."""

    kafka_bootstrap: str = doc("127.0.0.1:9092", "Kafka bootstrap address HOST:PORT.")
    group_id: str = doc("coevolve-explorer", "Consumer group; its committed offsets are the explorer's progress.")
    temperature: float = doc(0.7, "Sampling temperature of reflections and exploration runs.")
    max_new_tokens: int = doc(256, "New tokens per generation in exploration runs.")
    json_max_new_tokens: int = doc(1024, "New tokens per reflection (a JSON answer); the schema's bounds keep "
                                         "a complete answer within it.")
    tool_docs: str = doc("full", "How exploration runs' system prompt lists the tools (full or signatures): as the "
                                 "policy acting here was trained (the learner's tool_docs under run.shared_policy).")
    max_runs_per_period: int = doc(0, "Most exploration runs per period (0: no limit); the rest is skipped.")
    max_tokens_per_period: int = doc(0, "Most tokens (prompt and completion) per period (0: no limit).")
    max_seconds_per_period: float = doc(0.0, "Most wall time per period's exploration (0: no limit).")
    idle_exit_seconds: float = doc(0.0, "Stop after this long with nothing to read or explore; 0 runs until signalled.")
    run_id: str = doc("static", "Run the static strategy's start exploration is recorded under (coevolve run "
                                "sets it).")
    metrics_port: int = doc(-1, "Port of /healthz and /metrics; 0 picks one, -1 disables.")
    metrics_host: str = doc("127.0.0.1", "Address /healthz and /metrics listen on (0.0.0.0 in a pod).")

    def __post_init__(self) -> None:
        if min(self.max_new_tokens, self.json_max_new_tokens) < 1 or self.temperature < 0:
            raise ConfigError("max_new_tokens and json_max_new_tokens must be >= 1, temperature >= 0")
        if min(self.max_runs_per_period, self.max_tokens_per_period, self.max_seconds_per_period) < 0:
            raise ConfigError("period limits must be >= 0 (0: no limit)")


class Explorer(Service):
    """Gather signals, explore each closed period, publish, then commit."""

    name = "explorer"

    def __init__(self, cfg: ExplorerServiceConfig, core: ExplorerConfig, backend_cfg: BackendConfig):
        super().__init__(cfg)
        self.core, self.backend_cfg = core, backend_cfg
        self.buffer = SignalBuffer(core)
        self.sampling = SamplingConfig(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                       seed=backend_cfg.seed)
        self.json_sampling = dataclasses.replace(self.sampling, max_new_tokens=cfg.json_max_new_tokens)
        self.budget = Budget(cfg.max_runs_per_period, cfg.max_tokens_per_period, cfg.max_seconds_per_period)
        self.limits = EpisodeLimits(tool_docs=cfg.tool_docs)  # a bad tool_docs fails here, not at the first period
        self.delivered: dict = {}
        self.backend = self.consumer = self.producer = None
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
        self.m_tokens = counter("tokens", "Tokens (prompt and completion) of exploration episodes.")
        self.m_plans = counter("periods", "Periods closed and explored, by what closed them.", ["closed_by"])
        self.m_fallbacks = counter("fallbacks", "Periods that explored fallback_tasks seed tasks because no "
                                   "signal was explored.")

    def details(self) -> dict:
        return {"pending_signals": self.buffer.pending, "strategy": self.core.strategy}

    def start(self) -> None:
        from coevolve.services.agent.backends import make_backend
        from coevolve.services.envs.bfcl_data import seed_pool

        cfg = self.cfg
        categories = [c.strip() for c in self.core.categories.split(",") if c.strip()]
        self.task_ids = [t.task_id for t in seed_pool(categories, self.core.seed_tasks)]
        if self.core.strategy == "signal-guided":  # the random and static strategies read no model
            self.backend = make_backend(self.backend_cfg)
        self.producer = EventProducer(cfg.kafka_bootstrap, client_id="coevolve-explorer")
        self.consumer = EventConsumer(cfg.kafka_bootstrap, [SIGNALS.name, STEPS.name], group_id=cfg.group_id,
                                      service="explorer", deadletters=self.producer)
        self.log.info("explorer.started", bootstrap=cfg.kafka_bootstrap, strategy=self.core.strategy,
                      model=self.backend_cfg.model, backend=self.backend_cfg.backend)
        if self.core.strategy == "static":
            self._publish([self._explore(Plan(cfg.run_id, 0, 0, (), 0, 0, "start"))])
        self.last_event = time.monotonic()

    def step(self) -> None:
        """Poll once, gather, explore the periods that closed, publish, and commit when no signal waits."""
        items = self.consumer.poll(0.5)
        self.beat()
        plans: list[Plan] = []
        for item in items:
            if item.name == "SignalRaised":
                if self.buffer.add(item.event, time.monotonic()):
                    self.m_signals.inc()
                    self.delivered[str(item.event["event_id"])] = item
            elif item.name == "StepCompleted":
                plans += self.buffer.step_completed(str(item.event["run_id"]), int(item.event["step"]),
                                                    time.monotonic())
            else:
                self.consumer.reject(item, "invalid", f"expected SignalRaised or StepCompleted, got {item.name}")
        plans += self.buffer.expire(time.monotonic())
        if items or plans or not self.consumer.assigned():
            self.last_event = self.last_beat
        outcomes: list[Outcome] = []
        if plans:
            with self.consumer.working():  # model work outlasts the poll interval; keep the group
                outcomes = [self._explore(plan) for plan in plans]
        self.uncommitted += len(items)
        if self.buffer.waiting:  # a commit now would lose the waiting signals (or step) on a crash
            self._publish(outcomes)
        elif self.uncommitted or outcomes:
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
                               self.limits, json_sampling=self.json_sampling)
        self.m_skipped.labels("budget").inc(out.over_budget)
        self.m_runs.inc(out.runs)
        self.m_calls.inc(out.calls)
        self.m_tokens.inc(out.tokens)
        self.m_fallbacks.inc(out.fell_back)
        self.log.info("explorer.period", run_id=plan.run_id, steps=[plan.first_step, plan.last_step],
                      closed_by=plan.closed_by, clusters=len(plan.chosen), skipped=plan.skipped,
                      explorations=len(out.records), dead_lettered=len(out.rejected), tokens=out.tokens,
                      fell_back=out.fell_back)
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
        """Commit everything polled: every signal in it has been explored or dead-lettered."""
        self.delivered.clear()
        return self.consumer.commit()

    def finish(self) -> None:
        for closable in (self.consumer, self.producer, self.backend):
            if closable is not None:
                closable.close()
