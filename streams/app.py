"""The Faust app: agents read a table, call the pure functions of signals.py, write back, emit.

Topics (internal ones are prefixed by the app id and co-partitioned with the trajectories topic):
- `coevolve.trajectories` and `<app>-step-markers` -> `raise_attempt_signals`, table `task_to_attempts`
  (task_id -> {"p": partition, "runs": {run_id: task state}}): groups, forgetting, boundary. Markers
  not yet applied wait in table `partition_to_markers` (partition -> markers), so a restart keeps them.
- `coevolve.steps` -> `forward_steps`: for each completed step, a marker to every trajectories
  partition, and the step's trajectory count to the counts topic. As in replay, a marker takes effect
  just before the partition's first trajectory of its run with a higher step; if none comes, once the
  partition has been idle for `marker_idle_s`.
- `<app>-step-counts`, keyed by step (the group_by of pattern keys) -> `raise_rare_signals`, table
  `step_to_counts` ("run_id\\x1fstep" -> step state): rare, closed by count or by the grace period.
Every send of a batch is confirmed before its table writes, so a killed worker re-emits (same ids)
rather than loses. Undecodable or invalid input goes to `coevolve.deadletter` with its reason.
"""
from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import defaultdict

import faust
from faust.streams import _current_event  # the event whose partition a table write goes to
from faust.types import EventT

from coevolve.schemas import DecodeError, default_registry
from coevolve.services.broker.consumer import dead_letter
from coevolve.services.broker.offsets import true_end_offsets
from coevolve.services.broker.settings import FAUST_GROUP_TIMEOUTS_S
from coevolve.services.broker.topics import DEADLETTER, SIGNALS, STEPS, TRAJECTORIES, Topic
from coevolve.streams import signals as sig
from coevolve.streams.config import StreamsConfig
from coevolve.streams.metrics import Metrics

PARTITIONS = TRAJECTORIES.partitions
SERVICE = "streams"
# Tansu 0.6 answers ListOffsets(latest) with the last *batch*'s base offset + 1; table recovery reads
# changelogs up to probed true ends (see exact_highwaters). One record per batch would make the reported
# ends exact, but aiokafka then sends one record per partition per round trip, which stalled sends.
PRODUCER_BATCH_BYTES = 256 * 1024
# The grace-period tick checks an index of each partition's open steps, not every step ever seen; the
# index is rebuilt from the table this often (and at a worker's first tick), which picks up the open
# steps a rebalance brought.
INDEX_REBUILD_S = 60.0


def internal_topics(app_id: str) -> dict[str, Topic]:
    """The app's own topics, co-partitioned with coevolve.trajectories."""
    return {"markers": Topic(f"{app_id}-step-markers", "json", "partition", PARTITIONS),
            "counts": Topic(f"{app_id}-step-counts", "json", "run_id and step", PARTITIONS)}


def step_key(run_id: str, step: int) -> str:
    return f"{run_id}{sig.SEP}{step}"


def shorten_fetch_wait(app: faust.App, ms: int) -> None:
    """Faust creates its aiokafka consumer with fetch_max_wait_ms=1500 and no setting to change it;
    Tansu holds an empty fetch for that long even when data arrives, which adds up to 1.5 s per hop."""
    consumer = getattr(getattr(app.consumer, "_thread", None), "_consumer", None)
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is not None and getattr(fetcher, "_fetch_max_wait_ms", ms) != ms:
        fetcher._fetch_max_wait_ms = ms


def exact_highwaters(app: faust.App, bootstrap: str) -> None:
    """Table recovery reads each changelog up to its highwater; a short one loses the tail of the state."""
    consumer = app.consumer
    reported_highwaters = consumer.highwaters

    async def highwaters(*tps):
        return await asyncio.to_thread(true_end_offsets, bootstrap, await reported_highwaters(*tps))

    consumer.highwaters = highwaters


def build_app(cfg: StreamsConfig, metrics: Metrics) -> faust.App:
    th, limits = cfg.thresholds(), cfg.limits()
    registry = default_registry()
    app = faust.App(
        cfg.app_id, broker=f"kafka://{cfg.kafka_bootstrap}", store="memory://", datadir=str(cfg.datadir),
        web_enabled=cfg.metrics_port >= 0, web_port=max(cfg.metrics_port, 0), web_bind=cfg.metrics_host,
        web_host=cfg.metrics_host,
        topic_partitions=PARTITIONS, table_standby_replicas=0, consumer_auto_offset_reset="earliest",
        producer_acks=-1, topic_allow_declare=False, producer_max_batch_size=PRODUCER_BATCH_BYTES,
        producer_linger_ms=2, **FAUST_GROUP_TIMEOUTS_S)
    exact_highwaters(app, cfg.kafka_bootstrap)
    raw = dict(key_serializer="raw", value_serializer="raw")
    names = internal_topics(cfg.app_id)
    markers_name, counts_name = names["markers"].name, names["counts"].name
    trajectories_in = app.topic(TRAJECTORIES.name, markers_name, **raw)
    steps_in = app.topic(STEPS.name, **raw)
    markers = app.topic(markers_name, **raw)
    counts = app.topic(counts_name, **raw)
    signals_out = app.topic(SIGNALS.name, **raw)
    deadletters = app.topic(DEADLETTER.name, **raw)
    as_json = faust.Schema(key_type=str, key_serializer="json", value_serializer="json")
    task_to_attempts = app.Table("task_to_attempts", partitions=PARTITIONS, schema=as_json)
    step_to_counts = app.Table("step_to_counts", partitions=PARTITIONS, schema=as_json)
    partition_to_markers = app.Table("partition_to_markers", partitions=PARTITIONS, schema=as_json)

    async def send_all(sends: list) -> None:
        """Send, then wait until the broker has confirmed every message."""
        producer = app.producer
        futures = [await producer.send(topic.get_topic_name(), key, value, part, None, None)
                   for topic, key, value, part in sends]
        if futures:
            await asyncio.gather(*futures)

    def reject(sends: list, ev: EventT, error_type: str, reason: str) -> None:
        msg = ev.message
        metrics.dead_lettered.labels(error_type).inc()
        record = dead_letter(msg.topic, msg.partition, msg.offset, msg.key, ev.value or b"", error_type,
                             reason, SERVICE)
        sends.append((deadletters, msg.topic.encode(), registry.encode("DeadLettered", record), None))

    def emit(sends: list, signals: list[sig.Signal], now_ms: int) -> None:
        for s in signals:
            metrics.raised.labels(s.kind).inc()
            key = (s.task_id or s.subject).encode()
            sends.append((signals_out, key, registry.encode("SignalRaised", s.to_record(now_ms)), None))

    def write(table, writes: dict) -> None:
        """Write each key once, under an event of its partition (Faust picks the changelog partition
        from the current event, and a batch mixes partitions)."""
        for key, (ev, value) in writes.items():
            token = _current_event.set(weakref.ref(ev))
            try:
                table[key] = value
            finally:
                _current_event.reset(token)

    @app.agent(trajectories_in)
    async def raise_attempt_signals(stream):
        last_seen: dict[int, float] = {}  # partition -> when its last trajectory was processed
        candidates: dict[tuple, dict] = {}  # (run, step) -> pattern -> smallest event ids sent here
        async for events in stream.take_events(cfg.batch_size, cfg.batch_within_s):
            started = time.perf_counter()
            now = time.time()
            now_ms = int(now * 1000)
            sends: list = []
            writes: dict[str, tuple] = {}
            contributions: dict[tuple, list] = defaultdict(list)
            raised: list[sig.Signal] = []
            outcomes: dict[str, int] = defaultdict(int)
            pending: dict[int, list[dict]] = {}  # partition -> markers not yet applied (a table, read once)

            def pending_of(p: int) -> list[dict]:
                if p not in pending:
                    pending[p] = list(partition_to_markers.get(str(p)) or [])
                return pending[p]

            def state_of(task_id: str, ev: EventT) -> dict:
                if task_id not in writes:
                    writes[task_id] = (ev, task_to_attempts.get(task_id) or {"p": ev.message.partition, "runs": {}})
                else:
                    writes[task_id] = (ev, writes[task_id][1])
                return writes[task_id][1]

            def apply_markers(p: int, ev: EventT, due: list[dict]) -> None:
                pending[p] = [m for m in pending[p] if m not in due]
                for m in due:
                    for key in [k for k in candidates if k[0] == m["run_id"] and k[1] <= m["step"]]:
                        del candidates[key]
                local = {k: v for k, v in task_to_attempts.items() if v.get("p") == p}
                local.update({k: v for k, (e, v) in writes.items() if v.get("p") == p})
                for m in sorted(due, key=lambda m: m["step"]):
                    for task_id in sorted(local):
                        tstate = local[task_id]["runs"].get(m["run_id"])
                        if tstate and any(int(k) <= m["step"] for k in tstate["open"]):
                            raised.extend(sig.close_groups(state_of(task_id, ev)["runs"][m["run_id"]],
                                                           m["step"], th))

            last_by_partition: dict[int, EventT] = {}
            for ev in events:
                msg = ev.message
                p = msg.partition
                last_by_partition[p] = ev
                if msg.topic == markers_name:
                    try:
                        marker = json.loads(ev.value)
                    except (TypeError, ValueError) as exc:
                        reject(sends, ev, "malformed", f"step marker is not JSON: {exc}")
                        continue
                    if marker.get("kind") != "tick":
                        pending_of(p).append({**marker, "arrived": now})
                    continue
                last_seen[p] = now
                try:
                    name, event = registry.decode(ev.value, msg.topic, p, msg.offset)
                    if name != "TrajectoryRecorded":
                        raise sig.InvalidEvent(f"expected TrajectoryRecorded, got {name}")
                    r = sig.rollout_of(event, limits)
                except DecodeError as err:
                    reject(sends, ev, err.error_type, str(err))
                    continue
                except (sig.InvalidEvent, KeyError, TypeError) as exc:
                    reject(sends, ev, "invalid", str(exc))
                    continue
                if pending_of(p):
                    due = [m for m in pending[p] if m["run_id"] == r[1] and m["step"] < r[2]]
                    if due:
                        apply_markers(p, ev, due)
                tstate = state_of(r[3], ev)["runs"].setdefault(r[1], sig.new_task_state())
                outcome, found = sig.record_rollout(tstate, r, th)
                outcomes[outcome] += 1
                if outcome == sig.LATE:
                    reject(sends, ev, "late", f"group (run {r[1]}, task {r[3]}, step {r[2]}) already closed")
                elif outcome == sig.ACCEPTED:
                    raised.extend(found)
                    contributions[(r[1], r[2])].append(r)
            for p, ev in last_by_partition.items():
                idle = now - last_seen.get(p, 0.0) >= cfg.marker_idle_s
                due = [m for m in pending_of(p) if idle and now - m["arrived"] >= cfg.marker_idle_s]
                if due:
                    apply_markers(p, ev, due)
            emit(sends, raised, now_ms)
            for (run_id, step), rollouts in contributions.items():
                key = step_key(run_id, step)
                best = candidates.setdefault((run_id, step), {})
                items, evidence = [], {}
                for r in rollouts:
                    keys = sig.pattern_keys(r[7], th.pattern_length)
                    items.append([r[0], r[3], keys])
                    if sig.offer_candidate(best, r[0], keys, limits.rare_trajectories):
                        evidence[r[0]] = r[8]
                body = json.dumps({"kind": "counts", "run_id": run_id, "step": step, "items": items,
                                   "evidence": evidence}, separators=(",", ":")).encode()
                sends.append((counts, key.encode(), body, None))
            await send_all(sends)
            write(task_to_attempts, writes)
            write(partition_to_markers, {str(p): (last_by_partition[p], markers) for p, markers in pending.items()
                                         if markers != (partition_to_markers.get(str(p)) or [])})
            for outcome, n in outcomes.items():
                metrics.trajectories.labels(outcome).inc(n)
            metrics.batch_seconds.labels("attempts").observe(time.perf_counter() - started)

    @app.agent(steps_in)
    async def forward_steps(stream):
        async for events in stream.take_events(cfg.batch_size, cfg.batch_within_s):
            sends: list = []
            completed = []
            for ev in events:
                msg = ev.message
                try:
                    name, event = registry.decode(ev.value, msg.topic, msg.partition, msg.offset)
                    if name != "StepCompleted":
                        raise sig.InvalidEvent(f"expected StepCompleted, got {name}")
                    completed.append((event["run_id"], int(event["step"]), int(event["trajectory_count"])))
                except DecodeError as err:
                    reject(sends, ev, err.error_type, str(err))
                except (sig.InvalidEvent, KeyError, TypeError, ValueError) as exc:
                    reject(sends, ev, "invalid", str(exc))
            for run_id, step, count in completed:
                for p in range(PARTITIONS):
                    body = json.dumps({"kind": "completed", "run_id": run_id, "step": step}).encode()
                    sends.append((markers, run_id.encode(), body, p))
                body = json.dumps({"kind": "completed", "run_id": run_id, "step": step, "count": count})
                sends.append((counts, step_key(run_id, step).encode(), body.encode(), None))
            await send_all(sends)

    @app.agent(counts)
    async def raise_rare_signals(stream):
        open_steps: dict[int, set[str]] = defaultdict(set)  # partition -> keys of its steps not closed
        indexed_at: dict[int, float] = {}  # partition -> when open_steps was last rebuilt from the table
        async for events in stream.take_events(cfg.batch_size, cfg.batch_within_s):
            started = time.perf_counter()
            now = time.time()
            sends: list = []
            writes: dict[str, tuple] = {}
            raised: list[sig.Signal] = []
            for ev in events:
                p = ev.message.partition
                try:
                    body = json.loads(ev.value)
                    kind = body["kind"]
                except (TypeError, ValueError, KeyError) as exc:
                    reject(sends, ev, "malformed", f"step count message is not JSON: {exc}")
                    continue
                if kind == "tick":
                    if now - indexed_at.get(p, 0.0) >= INDEX_REBUILD_S:
                        open_steps[p] = {k for k, v in list(step_to_counts.items()) + [(k, v) for k, (e, v)
                                         in writes.items()] if v["p"] == p and not v["closed"]}
                        indexed_at[p] = now
                    for key in sorted(open_steps[p]):
                        state = writes[key][1] if key in writes else step_to_counts.get(key)
                        if state is None or state["closed"]:
                            open_steps[p].discard(key)
                        elif now - state["touched"] > cfg.grace_s:
                            writes[key] = (ev, state)
                            raised.extend(sig.close_step(state, state["run_id"], state["step"], th, True, limits))
                            open_steps[p].discard(key)
                    continue
                key = step_key(body["run_id"], body["step"])
                state = writes[key][1] if key in writes else step_to_counts.get(key)
                if state is None:
                    state = {**sig.new_step_state(), "p": p, "run_id": body["run_id"], "step": body["step"]}
                writes[key] = (ev, state)
                if state["closed"]:
                    continue
                state["touched"] = now
                if kind == "completed":
                    sig.set_trajectory_count(state, body["count"])
                else:
                    evidence = body["evidence"]
                    for event_id, task_id, keys in body["items"]:
                        sig.count_rollout(state, event_id, task_id, keys, evidence.get(event_id))
                if sig.step_complete(state):
                    raised.extend(sig.close_step(state, body["run_id"], body["step"], th, False, limits))
                    open_steps[p].discard(key)
                else:
                    open_steps[p].add(key)
            emit(sends, raised, int(now * 1000))
            await send_all(sends)
            write(step_to_counts, writes)
            metrics.batch_seconds.labels("rare").observe(time.perf_counter() - started)

    @app.timer(cfg.tick_s)
    async def tick():
        """Wake every partition's agents, so grace periods and idle markers expire without traffic."""
        shorten_fetch_wait(app, cfg.fetch_wait_ms)
        tick_body = b'{"kind":"tick"}'
        await send_all([(topic, b"tick", tick_body, p) for topic in (counts, markers) for p in range(PARTITIONS)])

    @app.page("/healthz")
    async def health(web, request):
        return web.json({"status": "ok", "app_id": cfg.app_id})

    @app.page("/metrics")
    async def prometheus(web, request):
        body, _content_type = metrics.exposition()
        return web.text(body.decode(), content_type="text/plain")  # aiohttp refuses a charset here

    return app
