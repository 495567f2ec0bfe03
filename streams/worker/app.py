"""The Faust app: agents read a table, call the batch logic (attempts.py, rare.py, over streams/rules.py),
write back and emit.

Topics (internal ones are prefixed by the app id and co-partitioned with the trajectories topic):
- `coevolve.trajectories` and `<app>-step-markers` -> `raise_attempt_signals`, tables `task_to_attempts`
  and `partition_to_markers`: groups, forgetting, boundary (`attempts.AttemptBatch`).
- `coevolve.steps` -> `forward_steps`: for each completed step, a marker to every trajectories
  partition, and the step's trajectory count to the counts topic.
- `<app>-step-counts`, keyed by step (the group_by of pattern keys) -> `raise_rare_signals`, table
  `step_to_counts`: rare, closed by count or by the grace period (`rare.RareBatch`).
Every send of a batch is confirmed before its table writes, and those before its events are
acknowledged, so a killed worker re-emits (same ids) rather than loses; a batch that cannot be stored
ends the worker unacknowledged (`faust_compat.store_batch`). Undecodable or invalid input
goes to `coevolve.deadletter` with its reason. Faust's quirks on this broker are in faust_compat.py.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict

import faust
from faust.types import EventT

from coevolve.schemas import DecodeError, default_registry
from coevolve.services.kafka.consumer import dead_letter
from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.kafka.settings import FAUST_GROUP_TIMEOUTS_S
from coevolve.services.kafka.topics import DEADLETTER, SIGNALS, STEPS, TRAJECTORIES, Topic, check_write
from coevolve.streams import rules
from coevolve.streams.worker.attempts import AttemptBatch, step_key
from coevolve.streams.worker.config import StreamsConfig
from coevolve.streams.worker.faust_compat import (PRODUCER_BATCH_BYTES, TRACKED_MEMORY, ConfirmedTable,
                                                  exact_highwaters, resume_in_order, send_confirmed,
                                                  shorten_fetch_wait, store_batch)
from coevolve.streams.worker.metrics import Metrics
from coevolve.streams.worker.rare import RareBatch

PARTITIONS = TRAJECTORIES.partitions
SERVICE = "streams"
# The grace-period tick checks an index of each partition's open steps, not every step ever seen; the
# index is rebuilt from the table this often (and at a worker's first tick), which picks up the open
# steps a rebalance brought.
INDEX_REBUILD_S = 60.0


# The tick timer writes 8 messages a second to the app's own topics for as long as a worker runs; what is
# older than this has been handled (a worker reads them within seconds), so the broker drops it.
INTERNAL_RETENTION = {"retention.ms": str(7 * 24 * 3600 * 1000)}


def internal_topics(app_id: str) -> dict[str, Topic]:
    """The app's own topics, co-partitioned with coevolve.trajectories, kept for a week."""
    return {"markers": Topic(f"{app_id}-step-markers", "json", "partition", PARTITIONS, INTERNAL_RETENTION),
            "counts": Topic(f"{app_id}-step-counts", "json", "run_id and step", PARTITIONS, INTERNAL_RETENTION)}


def new_app(cfg: StreamsConfig, security: KafkaSecurity | None = None) -> faust.App:
    """The Faust app with this broker's settings; /healthz and /metrics are served by the service, not Faust.
    Its credentials: `security`, else the process's (`KafkaSecurity.from_environment()`), which the
    worker's topic creation and its end-offset probes (faust_compat) read too."""
    credentials = (security or KafkaSecurity.from_environment()).faust_credentials()
    app = faust.App(
        cfg.app_id, broker=f"kafka://{cfg.kafka_bootstrap}", broker_credentials=credentials,
        store=TRACKED_MEMORY, datadir=str(cfg.datadir),
        web_enabled=False, topic_partitions=PARTITIONS, topic_replication_factor=cfg.replication_factor,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest", producer_acks=-1, topic_allow_declare=False,
        producer_max_batch_size=PRODUCER_BATCH_BYTES, producer_linger_ms=2, Table=ConfirmedTable,
        **FAUST_GROUP_TIMEOUTS_S)
    exact_highwaters(app, cfg.kafka_bootstrap)
    resume_in_order(app)
    return app


class Emitter:
    """Collects a batch's sends: signals and dead letters encoded as events, and raw messages."""

    def __init__(self, topics: dict, metrics: Metrics, on_log: frozenset[str] = frozenset()):
        self.topics, self.metrics, self.registry = topics, metrics, default_registry()
        self.on_log = on_log  # ids of the signals already on coevolve.signals (`command.signals_on_log`)
        self.sends: list = []

    def reject(self, ev: EventT, error_type: str, reason: str) -> None:
        msg = ev.message
        self.metrics.dead_lettered.labels(error_type).inc()
        record = dead_letter(msg.topic, msg.partition, msg.offset, msg.key, ev.value or b"", error_type,
                             reason, SERVICE)
        self.send("deadletters", msg.topic.encode(), self.registry.encode("DeadLettered", record))

    def signals(self, signals: list[rules.Signal], now_ms: int) -> None:
        for s in signals:
            if s.id in self.on_log:
                self.metrics.on_log.labels(s.kind).inc()
                continue
            self.metrics.raised.labels(s.kind).inc()
            key = (s.task_id or s.subject).encode()
            self.send("signals", key, self.registry.encode("SignalRaised", s.to_record(now_ms)))

    def send(self, topic: str, key: bytes, value: bytes, partition: int | None = None) -> None:
        self.sends.append((self.topics[topic], key, value, partition))

    def decode(self, ev: EventT, expected: str) -> dict | None:
        """The event of a message, or None after dead-lettering it (undecodable, or not `expected`)."""
        msg = ev.message
        try:
            name, event = self.registry.decode(ev.value, msg.topic, msg.partition, msg.offset)
        except DecodeError as err:
            self.reject(ev, err.error_type, str(err))
            return None
        if name != expected:
            self.reject(ev, "invalid", f"expected {expected}, got {name}")
            return None
        return event

    def json(self, ev: EventT, what: str) -> dict | None:
        """A JSON message's body, or None after dead-lettering it as malformed."""
        try:
            body = json.loads(ev.value)
            body["kind"]
        except (TypeError, ValueError, KeyError) as exc:
            self.reject(ev, "malformed", f"{what} is not JSON: {exc}")
            return None
        return body


def build_app(cfg: StreamsConfig, metrics: Metrics, on_log: frozenset[str] = frozenset()) -> faust.App:
    """The app, its topics and tables, and its three agents and tick; a signal whose id is in `on_log` is
    not sent again."""
    app = new_app(cfg)
    raw = dict(key_serializer="raw", value_serializer="raw")
    names = internal_topics(cfg.app_id)
    topics = {"trajectories": app.topic(TRAJECTORIES.name, names["markers"].name, **raw),
              "steps": app.topic(STEPS.name, **raw), "markers": app.topic(names["markers"].name, **raw),
              "counts": app.topic(names["counts"].name, **raw), "signals": app.topic(SIGNALS.name, **raw),
              "deadletters": app.topic(DEADLETTER.name, **raw)}
    for sink in (SIGNALS, DEADLETTER):  # the catalog topics the workers write (topics.WRITES)
        check_write("streams-worker", sink.name)
    as_json = faust.Schema(key_type=str, key_serializer="json", value_serializer="json")
    tables = {name: app.Table(name, partitions=PARTITIONS, schema=as_json)
              for name in ("task_to_attempts", "step_to_counts", "partition_to_markers")}
    add_attempt_agent(app, cfg, metrics, topics, tables, on_log)
    add_step_agents(app, cfg, metrics, topics, tables, on_log)
    return app


def add_attempt_agent(app: faust.App, cfg: StreamsConfig, metrics: Metrics, topics: dict, tables: dict,
                      on_log: frozenset[str]) -> None:
    th, limits, markers_name = cfg.thresholds(), cfg.limits(), topics["markers"].get_topic_name()
    task_to_attempts, partition_to_markers = tables["task_to_attempts"], tables["partition_to_markers"]

    @app.agent(topics["trajectories"])
    async def raise_attempt_signals(stream):
        last_seen: dict[int, float] = {}  # partition -> when its last trajectory was processed
        candidates: dict[tuple, dict] = {}  # (run, step) -> pattern -> smallest event ids sent here
        async for events in stream.take_events(cfg.batch_size, cfg.batch_within_s):
            started, now = time.perf_counter(), time.time()
            out = Emitter(topics, metrics, on_log)
            batch = AttemptBatch(th, limits, now, cfg.marker_idle_s, task_to_attempts, partition_to_markers,
                                 last_seen, candidates)
            ticked = False
            for ev in events:
                p, is_marker = ev.message.partition, ev.message.topic == markers_name
                batch.seen(p, ev, trajectory=not is_marker)
                if is_marker:
                    marker = out.json(ev, "step marker")
                    if marker is not None:
                        batch.add_marker(p, marker)
                        ticked = ticked or marker.get("kind") == "tick"
                    continue
                r = _rollout(out, ev, limits)
                if r is not None and batch.add_rollout(p, ev, r) == rules.LATE:
                    out.reject(ev, "late", f"group (run {r.run_id}, task {r.task_id}, step {r.step}) already closed")
            batch.close_idle()
            out.signals(batch.raised, int(now * 1000))
            for key, body in batch.count_messages():
                out.send("counts", key.encode(), body)
            await store_batch(app, "attempts", out.sends, (task_to_attempts, batch.writes),
                              (partition_to_markers, batch.marker_writes()))
            for outcome, n in batch.outcomes.items():
                metrics.trajectories.labels(outcome).inc(n)
            metrics.batch_seconds.labels("attempts").observe(time.perf_counter() - started)
            if ticked:
                metrics.ticked("attempts")


def _rollout(out: Emitter, ev: EventT, limits: rules.EvidenceLimits) -> rules.Rollout | None:
    """The message's rollout, or None after dead-lettering it."""
    event = out.decode(ev, "TrajectoryRecorded")
    if event is None:
        return None
    try:
        return rules.rollout_of(event, limits)
    except (rules.InvalidEvent, KeyError, TypeError) as exc:
        out.reject(ev, "invalid", str(exc))
        return None


def add_step_agents(app: faust.App, cfg: StreamsConfig, metrics: Metrics, topics: dict, tables: dict,
                    on_log: frozenset[str]) -> None:
    th, limits, step_to_counts = cfg.thresholds(), cfg.limits(), tables["step_to_counts"]

    @app.agent(topics["steps"])
    async def forward_steps(stream):
        async for events in stream.take_events(cfg.batch_size, cfg.batch_within_s):
            out, forwarded = Emitter(topics, metrics), 0
            for ev in events:
                event = out.decode(ev, "StepCompleted")
                try:
                    completed = event and (event["run_id"], int(event["step"]), int(event["trajectory_count"]))
                except (KeyError, TypeError, ValueError) as exc:
                    out.reject(ev, "invalid", str(exc))
                    continue
                if completed:
                    _forward(out, *completed)
                    forwarded += 1
            await store_batch(app, "steps", out.sends)
            metrics.steps.labels("forwarded").inc(forwarded)

    @app.agent(topics["counts"])
    async def raise_rare_signals(stream):
        open_steps: dict[int, set[str]] = defaultdict(set)  # partition -> keys of its steps not closed
        indexed_at: dict[int, float] = {}  # partition -> when open_steps was last rebuilt from the table
        async for events in stream.take_events(cfg.batch_size, cfg.batch_within_s):
            started, now = time.perf_counter(), time.time()
            out = Emitter(topics, metrics, on_log)
            batch = RareBatch(th, limits, now, cfg.grace_s, INDEX_REBUILD_S, step_to_counts, open_steps, indexed_at)
            ticked = False
            for ev in events:
                body = out.json(ev, "step count message")
                if body is None:
                    continue
                if body["kind"] == "tick":
                    batch.tick(ev.message.partition, ev)
                    ticked = True
                else:
                    batch.add(ev.message.partition, ev, body)
            out.signals(batch.raised, int(now * 1000))
            await store_batch(app, "rare", out.sends, (step_to_counts, batch.writes))
            for stage, n in batch.closed.items():
                metrics.steps.labels(stage).inc(n)
            metrics.batch_seconds.labels("rare").observe(time.perf_counter() - started)
            if ticked:
                metrics.ticked("rare")

    @app.timer(cfg.tick_s)
    async def tick():
        """Wake every partition's agents, so grace periods and idle markers expire without traffic."""
        shorten_fetch_wait(app, cfg.fetch_wait_ms)
        await send_confirmed(app, [(topics[name], b"tick", b'{"kind":"tick"}', p)
                                   for name in ("counts", "markers") for p in range(PARTITIONS)])


def _forward(out: Emitter, run_id: str, step: int, count: int) -> None:
    """A completed step: a marker to every trajectories partition, its trajectory count to the counts topic."""
    for p in range(PARTITIONS):
        out.send("markers", run_id.encode(), json.dumps({"kind": "completed", "run_id": run_id, "step": step}).encode(), p)
    body = json.dumps({"kind": "completed", "run_id": run_id, "step": step, "count": count})
    out.send("counts", step_key(run_id, step).encode(), body.encode())
