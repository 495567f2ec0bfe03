"""Live signal pipeline: trajectory events/s through the broker into signals, and step-to-signal delay.

    python -m bench.bench_live [--events N] [--workers W] [--repeats R] [--latency-rate 2000]

Starts the embedded broker and W `coevolve streams worker` processes, warms them up on a small run,
then per repeat publishes a simulated run (pre-encoded) as fast as the producer goes and times it
until the last of the signals the replay of the same run predicts has arrived on coevolve.signals:
rate = trajectory events / that time. The latency run publishes at --latency-rate events/s and, per
step, measures the delay from sending its completed-step event to receiving its last signal.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import machine, report
from coevolve.schemas import default_registry
from coevolve.services.broker.consumer import EventConsumer
from coevolve.services.broker.embedded import EmbeddedBroker, free_port
from coevolve.services.broker.producer import EventProducer
from coevolve.services.broker.topics import SIGNALS, create_topics
from coevolve.services.simulate import SimulationConfig, Simulator
from coevolve.streams.signals import replay_signals

STEP_SIZE = 16 * 8  # trajectories per step with the simulator's defaults


def simulate(run_id: str, steps: int) -> tuple[list, set[str]]:
    """The run's messages, pre-encoded, and the ids of the signals its replay raises."""
    registry = default_registry()
    cfg = SimulationConfig(run_id=run_id, steps=steps, synthesized_per_step=0)
    events = [(topic, key, name, e) for topic, key, name, e in Simulator(cfg).events() if name != "TaskChecked"]
    expected = {s.id for s in replay_signals((name, e) for _, _, name, e in events)}
    return [(topic, key, name, e["step"], registry.encode(name, e)) for topic, key, name, e in events], expected


def start_workers(bootstrap: str, n: int, workdir: Path) -> list[subprocess.Popen]:
    app_id = f"bench-{uuid.uuid4().hex[:8]}"
    procs = []
    for i in range(n):
        cmd = [str(Path(sys.executable).with_name("coevolve")), "streams", "worker", "--bootstrap", bootstrap,
               "--app-id", app_id, "--web-port", str(free_port()), "--datadir", str(workdir / f"w{i}")]
        log = open(workdir / f"worker{i}.log", "wb")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def publish(producer: EventProducer, messages: list, rate: float = 0.0) -> dict[int, float]:
    """Send the messages (at `rate` per second, 0: as fast as possible); return step -> send time."""
    sent_at: dict[int, float] = {}
    start = time.monotonic()
    for i, (topic, key, name, step, payload) in enumerate(messages):
        if rate > 0:
            ahead = i / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        producer.send_raw(topic, payload, key, "bench")
        if name == "StepCompleted":
            producer.flush()
            sent_at[step] = time.monotonic()
    producer.flush()
    return sent_at


def await_signals(consumer: EventConsumer, expected: set[str], timeout_s: float) -> dict[str, tuple[int, float]]:
    """Consume until every expected id arrived; return id -> (step, arrival time)."""
    seen: dict[str, tuple[int, float]] = {}
    deadline = time.monotonic() + timeout_s
    while not expected <= seen.keys():
        if time.monotonic() > deadline:
            missing = len(expected - seen.keys())
            raise TimeoutError(f"{missing} of {len(expected)} expected signals missing after {timeout_s:.0f} s")
        for item in consumer.poll(0.05):
            seen.setdefault(item.event["event_id"], (item.event["step"], time.monotonic()))
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000, help="Trajectory events per throughput run.")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-rate", type=float, default=2000.0, help="Events/s of the latency run (0 skips).")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--show-logs", action="store_true", help="Print the end of each worker's log.")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        workers = start_workers(broker.bootstrap, args.workers, Path(tmp))
        consumer = EventConsumer(broker.bootstrap, [SIGNALS.name], service="bench", from_beginning=False)
        producer = EventProducer(broker.bootstrap, client_id="bench")
        try:
            warm, expected = simulate("warm", 2)
            consumer.poll(0.5)
            publish(producer, warm)
            await_signals(consumer, expected, 120)
            steps = max(1, args.events // STEP_SIZE)
            rates = []
            for repeat in range(args.repeats):
                messages, expected = simulate(f"throughput-{repeat}", steps)
                start = time.monotonic()
                publish(producer, messages)
                published = time.monotonic() - start
                seen = await_signals(consumer, expected, 300)
                elapsed = max(t for _, t in seen.values()) - start
                rates.append(steps * STEP_SIZE / elapsed)
                print(f"run {repeat}: {steps * STEP_SIZE} events, {len(expected)} signals, published in "
                      f"{published:.2f} s, last signal after {elapsed:.2f} s", flush=True)
            report(f"live, {args.workers} worker(s), events -> signals", statistics.median(rates), "events/s", rates)
            if args.latency_rate > 0:
                steps = max(2, int(args.latency_rate * args.latency_seconds / STEP_SIZE))
                messages, expected = simulate("latency", steps)
                sent_at = publish(producer, messages, args.latency_rate)
                seen = await_signals(consumer, expected, 120)
                last: dict[int, float] = {}
                for step, t in seen.values():
                    last[step] = max(last.get(step, 0.0), t)
                delays = sorted(max(0.0, last[s] - sent_at[s]) for s in last if s in sent_at)
                p50 = delays[len(delays) // 2]
                p99 = delays[min(len(delays) - 1, int(0.99 * len(delays)))]
                print(f"latency at {args.latency_rate:,.0f} events/s, {len(delays)} steps: completed-step "
                      f"event -> last signal p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
                      f"max {delays[-1] * 1000:.0f} ms")
        finally:
            producer.close()
            consumer.close()
            for proc in workers:
                proc.terminate()
            for proc in workers:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if args.show_logs:
                for log in Path(tmp).glob("*.log"):
                    print(log.read_text()[-3000:])


if __name__ == "__main__":
    main()
