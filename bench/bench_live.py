"""Live signal pipeline: trajectory events/s through the broker into signals, and step-to-signal delay.

    python -m bench.bench_live [--events N] [--workers W] [--repeats R] [--latency-rate 2000]

Throughput, per repeat: a fresh embedded broker gets a simulated run (pre-encoded, published before
the workers start), then W `coevolve streams worker` processes start on it. The clock starts when the
workers' /metrics first count a processed trajectory (c0 of them) and stops when the last of the
signals that the replay of the same run predicts has arrived on coevolve.signals:
rate = (N - c0) / elapsed. Latency: with the workers running, a run is published at --latency-rate
events/s (after WARM_S seconds at that rate, unmeasured, while the workers settle after start-up);
per step, the delay from sending its completed-step event to receiving its last signal.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import machine, report
from coevolve.schemas import default_registry
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import SIGNALS, create_topics
from coevolve.services.runtime.ports import free_port
from coevolve.services.simulate import SimulationConfig, Simulator
from coevolve.streams.replay.engine_python import replay_signals

STEP_SIZE = 16 * 8  # trajectories per step with the simulator's defaults
WARM_S = 3.0  # the latency run first publishes this long at its rate, unmeasured: the workers' start-up


def simulate(run_id: str, steps: int) -> tuple[list, set[str]]:
    """The run's messages, pre-encoded, and the ids of the signals its replay raises."""
    registry = default_registry()
    cfg = SimulationConfig(run_id=run_id, steps=steps, synthesized_per_step=0)
    events = [(topic, key, name, e) for topic, key, name, e in Simulator(cfg).events() if name != "TaskChecked"]
    expected = {s.id for s in replay_signals((name, e) for _, _, name, e in events)}
    return [(topic, key, name, e["step"], registry.encode(name, e)) for topic, key, name, e in events], expected


def start_workers(bootstrap: str, n: int, workdir: Path) -> tuple[list[subprocess.Popen], list[int]]:
    app_id = f"bench-{uuid.uuid4().hex[:8]}"
    workdir.mkdir(parents=True, exist_ok=True)
    procs, ports = [], []
    for i in range(n):
        ports.append(free_port())
        cmd = [str(Path(sys.executable).with_name("coevolve")), "streams", "worker", "--bootstrap", bootstrap,
               "--app-id", app_id, "--metrics-port", str(ports[-1]), "--datadir", str(workdir / f"w{i}")]
        log = open(workdir / f"worker{i}.log", "wb")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return procs, ports


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


def processed(ports: list[int]) -> int:
    """Trajectories the workers have processed so far, from their /metrics."""
    total = 0
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("signals_trajectories_total{"))
    return int(total)


def throughput_run(args, repeat: int, workdir: Path) -> float:
    steps = max(1, args.events // STEP_SIZE)
    messages, expected = simulate(f"throughput-{repeat}", steps)
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        with EventProducer(broker.bootstrap, client_id="bench") as producer:
            publish(producer, messages)
        consumer = EventConsumer(broker.bootstrap, [SIGNALS.name], service="bench")
        workers, ports = start_workers(broker.bootstrap, args.workers, workdir / f"r{repeat}")
        try:
            deadline = time.monotonic() + 120
            while (c0 := processed(ports)) == 0:
                if time.monotonic() > deadline:
                    raise TimeoutError("workers processed nothing in 120 s")
                time.sleep(0.05)
            start = time.monotonic()
            seen = await_signals(consumer, expected, 600)
            elapsed = max(t for _, t in seen.values()) - start
        finally:
            consumer.close()
            stop_workers(workers, args.show_logs, workdir / f"r{repeat}")
    rate = (steps * STEP_SIZE - c0) / elapsed
    print(f"run {repeat}: {steps * STEP_SIZE} events ({c0} before the clock), {len(expected)} signals, "
          f"{elapsed:.2f} s: {rate:,.0f} events/s", flush=True)
    return rate


def latency_run(args, workdir: Path) -> None:
    steps = max(2, int(args.latency_rate * args.latency_seconds / STEP_SIZE))
    warm, warm_expected = simulate("warm", max(2, int(args.latency_rate * WARM_S / STEP_SIZE)))
    messages, expected = simulate("latency", steps)
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        consumer = EventConsumer(broker.bootstrap, [SIGNALS.name], service="bench")
        workers, _ports = start_workers(broker.bootstrap, args.workers, workdir / "latency")
        try:
            with EventProducer(broker.bootstrap, client_id="bench") as producer:
                publish(producer, warm, args.latency_rate)
                await_signals(consumer, warm_expected, 120)
                with ThreadPoolExecutor(1) as pool:  # receive while publishing, so arrival times are real
                    receiving = pool.submit(await_signals, consumer, expected, 120 + args.latency_seconds)
                    sent_at = publish(producer, messages, args.latency_rate)
                    seen = receiving.result()
        finally:
            consumer.close()
            stop_workers(workers, args.show_logs, workdir / "latency")
    last: dict[int, float] = {}
    for step, t in seen.values():
        last[step] = max(last.get(step, 0.0), t)
    by_step = [max(0.0, last[s] - sent_at[s]) for s in sorted(last) if s in sent_at]
    tenth = max(1, len(by_step) // 10)
    print(f"delay trend: first {tenth} steps median {statistics.median(by_step[:tenth]) * 1000:.0f} ms, "
          f"last {tenth} steps median {statistics.median(by_step[-tenth:]) * 1000:.0f} ms")
    delays = sorted(by_step)
    p50 = delays[len(delays) // 2]
    p99 = delays[min(len(delays) - 1, int(0.99 * len(delays)))]
    print(f"latency, {args.workers} worker(s), {args.latency_rate:,.0f} events/s, {len(delays)} steps: "
          f"completed-step event -> last signal p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {delays[-1] * 1000:.0f} ms")


def stop_workers(workers: list[subprocess.Popen], show_logs: bool, workdir: Path) -> None:
    for proc in workers:
        proc.terminate()
    for proc in workers:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    if show_logs:
        for log in sorted(workdir.glob("*.log")):
            print(log.read_text()[-3000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000, help="Trajectory events per throughput run.")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="Throughput runs (0: latency only).")
    parser.add_argument("--latency-rate", type=float, default=2000.0, help="Events/s of the latency run (0 skips).")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--show-logs", action="store_true", help="Print the end of each worker's log.")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        rates = [throughput_run(args, r, Path(tmp)) for r in range(args.repeats)]
        if rates:
            report(f"live, {args.workers} worker(s), events -> signals", statistics.median(rates), "events/s", rates)
        if args.latency_rate > 0:
            latency_run(args, Path(tmp))


if __name__ == "__main__":
    main()
