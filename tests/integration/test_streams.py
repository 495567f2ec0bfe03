"""The live signal pipeline through the real broker and real Faust workers (`coevolve streams worker`).

Each test publishes a log, runs worker processes on it, and compares the signals on coevolve.signals
with `coevolve replay` of the same log from the topics.
"""
from __future__ import annotations

import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from coevolve.schemas import default_registry
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.runtime.ports import free_port
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import DEADLETTER, SIGNALS, STEPS, TRAJECTORIES
from coevolve.services.simulate import SimulationConfig, Simulator
from coevolve.streams.replay.engine_python import replay_topics
from coevolve.streams.rules import Signal
from coevolve.streams.worker.app import internal_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REGISTRY = default_registry()


def simulated(run_id: str, steps: int, seed: int = 0) -> list[tuple[str, str, str, dict]]:
    cfg = SimulationConfig(run_id=run_id, steps=steps, seed=seed, synthesized_per_step=0, forget_probability=0.15)
    return [(t, k, n, e) for t, k, n, e in Simulator(cfg).events()]


def publish(bootstrap: str, events, raw: list[tuple[str, str, bytes]] = ()) -> None:
    """Send events (a step's trajectories are confirmed before its completed-step event), then raw bytes."""
    with EventProducer(bootstrap, client_id="test") as producer:
        for topic, key, name, event in events:
            if name == "StepCompleted":
                producer.flush()
            producer.send(topic, event, key=key, record_name=name)
            if name == "StepCompleted":
                producer.flush()
        for topic, key, payload in raw:
            producer.send_raw(topic, payload, key, "raw")


class Worker:
    """One `coevolve streams worker` process."""

    def __init__(self, bootstrap: str, app_id: str, workdir: Path, name: str, grace_s: float = 600):
        self.cmd = [str(Path(sys.executable).with_name("coevolve")), "streams", "worker", "--bootstrap", bootstrap,
                    "--app-id", app_id, "--metrics-port", str(free_port()), "--datadir", str(workdir / name),
                    "--grace-s", str(grace_s)]
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Worker":
        env = {**os.environ, "STREAMS_LOG_LEVEL": "info"}
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        return self

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def metrics(self) -> str:
        """The worker's signals_* counters, for failure messages."""
        port = self.cmd[self.cmd.index("--metrics-port") + 1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                text = resp.read().decode()
        except OSError as exc:
            return f"no /metrics: {exc}"
        return " ".join(line for line in text.splitlines()
                        if line.startswith("signals_") and line.split("{")[0].endswith("_total"))

    def health(self) -> tuple[int, dict]:
        """Its /healthz status code and body."""
        port = self.cmd[self.cmd.index("--metrics-port") + 1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def report(self) -> str:
        """Its counters and the tail of its log, for failure messages."""
        return f"{self.log.name}: alive={self.alive()} {self.metrics()}\n{self.log.read_text()[-2500:]}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class SignalReader:
    """Every SignalRaised message on coevolve.signals so far, in arrival order."""

    def __init__(self, bootstrap: str):
        self.consumer = EventConsumer(bootstrap, [SIGNALS.name], service="test")
        self.messages: list[dict] = []

    def until(self, expected: dict[str, dict], timeout_s: float, workers=(), cap_s: float | None = None,
              explain=lambda: "") -> None:
        """Read until every expected signal has come. Fail after `timeout_s` or, with `cap_s`, after
        `timeout_s` without progress (a new expected signal, or a worker counter that moved) or `cap_s`
        in all; the failure says what is missing, `explain()`, and each worker's counters and log tail."""
        begin = progress = checked = time.monotonic()
        counters = [w.metrics() for w in workers]
        while not expected.keys() <= {m["event_id"] for m in self.messages}:
            for w in workers:
                assert w.alive(), f"worker died: {w.log.read_text()[-3000:]}"
            now = time.monotonic()
            if cap_s is not None and now - checked >= 5:
                checked, moved = now, [w.metrics() for w in workers]
                if moved != counters:
                    counters, progress = moved, now
            waited = now - (begin if cap_s is None else progress)
            if waited > timeout_s or (cap_s is not None and now - begin > cap_s):
                try:
                    why = explain()
                except Exception as exc:  # a failing explanation must not hide what is missing
                    why = f"explain() failed: {exc!r}"
                raise AssertionError("\n".join([self.missing(expected), why, *(w.report() for w in workers)]))
            arrived = [item.event for item in self.consumer.poll(0.2)]
            if cap_s is not None and {m["event_id"] for m in arrived} & expected.keys():
                progress = now
            self.messages += arrived
        self.messages += [item.event for item in self.consumer.drain(idle_s=2.0)]  # anything extra

    def missing(self, expected: dict[str, dict]) -> str:
        """How many expected signals have not come, by kind and step, and the first ten."""
        missing = [expected[k] for k in expected.keys() - {m["event_id"] for m in self.messages}]
        kinds: dict[str, set[int]] = {}
        for s in missing:
            kinds.setdefault(s["type"], set()).add(s["step"])
        return (f"{len(missing)} of {len(expected)} signals missing: " + ", ".join(
            f"{s['type']} step {s['step']} {s['subject']}" for s in missing[:10])
            + "; by kind, steps: " + "; ".join(f"{k} {sorted(v)}" for k, v in sorted(kinds.items())))

    def missing_steps(self, expected: dict[str, dict]) -> set[int]:
        return {expected[k]["step"] for k in expected.keys() - {m["event_id"] for m in self.messages}}

    def by_id(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for m in self.messages:
            form = Signal.from_record(m).to_json()
            assert out.setdefault(m["event_id"], form) == form, "one id, two different signals"
        return out


def step_counts(bootstrap: str, app_id: str, events: list, missing: set[int] = frozenset()) -> str:
    """What the rare agent's input topic holds: the steps whose completed count was forwarded, those
    with fewer distinct trajectories counted than their step claims, and for each `missing` step where
    its messages sit against the group's committed offset (for failure messages)."""
    topic = internal_topics(app_id)["counts"]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=app_id, enable_auto_commit=False)
    tps = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
    committed = {tp.partition: consumer.committed(tp) for tp in tps}
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    forwarded, counted, placed, deadline = set(), {}, {}, time.monotonic() + 20
    while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
        for records in consumer.poll(200).values():
            for r in records:
                body = json.loads(r.value)
                if body["kind"] == "completed":
                    forwarded.add(body["step"])
                elif body["kind"] == "counts":
                    counted.setdefault(body["step"], set()).update(item[0] for item in body["items"])
                if body.get("step") in missing:
                    placed.setdefault(body["step"], []).append((r.partition, r.offset, body["kind"]))
    consumer.close()
    claimed = {e["step"]: e["trajectory_count"] for _t, _k, n, e in events if n == "StepCompleted"}
    short = {step: (len(counted.get(step, ())), n) for step, n in claimed.items() if len(counted.get(step, ())) < n}
    return (f"{topic.name}: completed counts forwarded for steps {sorted(forwarded)} of {sorted(claimed)}; "
            f"steps with fewer trajectories counted than claimed (counted, claimed): {short}; "
            f"committed by partition {committed}, ends {[ends[tp] for tp in tps]}; missing steps' messages "
            f"(partition, offset, kind): {placed}")


def assert_same(live: dict[str, dict], expected: dict[str, dict]) -> None:
    assert live.keys() == expected.keys(), (f"missing {len(expected.keys() - live.keys())}, "
                                            f"extra {len(live.keys() - expected.keys())}")
    for key, want in expected.items():
        got = live[key]
        diff = {f: (got.get(f), want[f]) for f in want if got.get(f) != want[f]}
        if "evidence" in diff:
            diff["evidence"] = {f: (got["evidence"].get(f), v) for f, v in want["evidence"].items()
                                if got["evidence"].get(f) != v}
        assert not diff, f"{want['type']} {want['step']} {want['subject']}: live, replay differ in {diff}"


def expected_from_replay(bootstrap: str) -> dict[str, dict]:
    return {s.id: s.to_json() for s in replay_topics(bootstrap).signals}


@pytest.fixture
def workdir(tmp_path):
    return tmp_path


def drop_rollouts(events: list, victims: set[int]) -> list:
    """Leave out the trajectories at these indexes (their groups stay short) and lower their step's count."""
    out, dropped, index = [], {}, 0
    for topic, key, name, event in events:
        if name == "TrajectoryRecorded":
            index += 1
            if index - 1 in victims:
                dropped[event["step"]] = dropped.get(event["step"], 0) + 1
                continue
        elif name == "StepCompleted" and event["step"] in dropped:
            event = {**event, "trajectory_count": event["trajectory_count"] - dropped[event["step"]]}
        out.append((topic, key, name, event))
    return out


def mixed_group_rollout(events: list, step: int) -> int:
    """The index of a trajectory whose group, at `step`, stays mixed (a boundary) without it."""
    trajectories = [e for _, _, n, e in events if n == "TrajectoryRecorded"]
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(trajectories):
        if e["step"] == step:
            groups.setdefault(e["task_id"], []).append(i)
    for indexes in groups.values():
        scores = [trajectories[i]["score"] >= 0.5 for i in indexes]
        if scores.count(True) >= 2 and scores.count(False) >= 2:
            return indexes[0]
    raise AssertionError(f"no mixed group at step {step}")


def test_live_signals_equal_replay_and_redelivery_changes_nothing(bootstrap, workdir):
    # two short groups: one in step 0, closed by its step's event; one in the last step, closed when idle
    events = simulated("live", 12, seed=1)
    events = drop_rollouts(events, {mixed_group_rollout(events, 0), mixed_group_rollout(events, 11)})
    trajectories = [e for e in events if e[2] == "TrajectoryRecorded"]
    redelivered = trajectories[5:40] + trajectories[300:310]  # at-least-once: the same events again
    worker = Worker(bootstrap, f"t-{uuid.uuid4().hex[:8]}", workdir, "w0").start()
    reader = SignalReader(bootstrap)
    try:
        publish(bootstrap, events[:400])
        publish(bootstrap, redelivered)
        publish(bootstrap, events[400:])
        expected = expected_from_replay(bootstrap)
        kinds = {s["type"] for s in expected.values()}
        assert kinds == {"forgetting", "boundary", "rare"}
        short = [s for s in expected.values() if s["type"] == "boundary" and len(s["evidence"]["scores"]) == 7]
        assert len(short) == 2, "both short groups raise a boundary, so closing by step is covered"
        reader.until(expected, 120, [worker])
        assert_same(reader.by_id(), expected)
        assert len(reader.messages) == len(expected), "an uninterrupted run sends each signal once"
        status, body = worker.health()  # both tick-reading agents handled a tick within the last seconds
        assert status == 200 and body["failures"] == [], body
        assert set(body["seconds_since_tick"]) == {"attempts", "rare"}
        assert max(body["seconds_since_tick"].values()) < 10, body
    finally:
        worker.stop()
        reader.consumer.close()


def test_killed_worker_restarted_mid_stream_yields_the_same_signals(bootstrap, workdir):
    events = simulated("crash", 40, seed=2)
    app_id = f"t-{uuid.uuid4().hex[:8]}"
    workers = [Worker(bootstrap, app_id, workdir, f"w{i}").start() for i in range(2)]
    reader = SignalReader(bootstrap)
    try:
        half = len(events) // 2
        publish(bootstrap, events[:half])
        deadline = time.monotonic() + 180  # Tansu has held a fresh group's first fetches for ~100 s
        while len(reader.messages) < 50:  # both workers are mid-stream
            assert time.monotonic() < deadline, (
                f"{len(reader.messages)} signals from the first half; workers: {[w.metrics() for w in workers]}")
            reader.messages += [item.event for item in reader.consumer.poll(0.2)]
        workers[0].kill()
        publish(bootstrap, events[half:])
        time.sleep(3)
        workers[0].start()
        expected = expected_from_replay(bootstrap)
        # Tansu may hold a killed member's rejoin ~100 s; a slow machine keeps making progress meanwhile
        reader.until(expected, 240, workers, cap_s=420,
                     explain=lambda: step_counts(bootstrap, app_id, events, reader.missing_steps(expected)))
        assert_same(reader.by_id(), expected)  # none lost, none different; a redelivered one has the same id
    finally:
        for w in workers:
            w.stop()
        reader.consumer.close()


def test_bad_input_is_dead_lettered_and_the_stream_goes_on_and_grace_closes_a_step(bootstrap, workdir):
    before, after = simulated("before", 3, seed=3), simulated("after", 3, seed=4)
    first = next(e for t, k, n, e in before if n == "TrajectoryRecorded")
    late = {**first, "event_id": "late-rollout", "rollout_index": 99}
    nan = {**first, "event_id": "nan-score", "step": 1, "score": math.nan}
    body = REGISTRY.encode("TrajectoryRecorded", first)[10:]
    unknown = b"\xc3\x01" + struct.pack("<Q", 0x1234567890ABCDEF) + body
    raw = [(TRAJECTORIES.name, "x", b"\x00not avro at all"), (TRAJECTORIES.name, "x", unknown),
           (TRAJECTORIES.name, first["task_id"], REGISTRY.encode("TrajectoryRecorded", nan)),
           (TRAJECTORIES.name, first["task_id"], REGISTRY.encode("TrajectoryRecorded", late)),
           (STEPS.name, "x", b"\xc3\x01short")]
    # the last step of "after" claims more trajectories than it published: it closes by the grace period
    after[-1] = (*after[-1][:3], {**after[-1][3], "trajectory_count": after[-1][3]["trajectory_count"] + 5})
    worker = Worker(bootstrap, f"t-{uuid.uuid4().hex[:8]}", workdir, "w0", grace_s=8).start()
    reader = SignalReader(bootstrap)
    dead = EventConsumer(bootstrap, [DEADLETTER.name], service="test")
    try:
        publish(bootstrap, before, raw)
        publish(bootstrap, after)
        expected = expected_from_replay(bootstrap)
        assert {s["run_id"] for s in expected.values()} == {"before", "after"}
        incomplete = {(s["run_id"], s["step"]) for s in expected.values() if s["incomplete"]}
        assert incomplete == {("after", after[-1][3]["step"])}
        reader.until(expected, 120, [worker])
        assert_same(reader.by_id(), expected)
        letters, deadline = [], time.monotonic() + 30
        while len(letters) < len(raw) and time.monotonic() < deadline:
            letters += [item.event for item in dead.poll(0.2)]
        by_type = {d["error_type"]: d for d in letters}
        assert sorted(by_type) == ["invalid", "late", "malformed", "unknown_schema"]
        assert len(letters) == len(raw)
        assert by_type["unknown_schema"]["payload"] == unknown
        assert "score is not a finite number" in by_type["invalid"]["reason"]
        assert "already closed" in by_type["late"]["reason"]
        assert all(d["service"] == "streams" and d["reason"] for d in letters)
        assert {d["source_topic"] for d in letters} == {TRAJECTORIES.name, STEPS.name}
        assert worker.alive()
    finally:
        worker.stop()
        reader.consumer.close()
        dead.close()


def test_a_restarted_worker_closes_by_grace_the_open_steps_its_tables_recover(bootstrap, workdir):
    events = simulated("held", 3, seed=5)
    # the last step claims more trajectories than it published: only the grace period closes it
    events[-1] = (*events[-1][:3], {**events[-1][3], "trajectory_count": events[-1][3]["trajectory_count"] + 5})
    app_id = f"t-{uuid.uuid4().hex[:8]}"
    worker = Worker(bootstrap, app_id, workdir, "w0", grace_s=30).start()
    reader = SignalReader(bootstrap)
    try:
        publish(bootstrap, events)
        expected = expected_from_replay(bootstrap)
        held = {k for k, s in expected.items() if s["incomplete"]}
        assert held and all(expected[k]["step"] == events[-1][3]["step"] for k in held)
        reader.until({k: s for k, s in expected.items() if k not in held}, 180, [worker])
        worker.stop()  # well within the grace period of the held step's last count
        assert not held & reader.by_id().keys()
        worker = Worker(bootstrap, app_id, workdir, "w1", grace_s=30).start()
        reader.until(expected, 240, [worker])  # its open-step index comes from the recovered table
        assert_same(reader.by_id(), expected)
    finally:
        worker.stop()
        reader.consumer.close()
