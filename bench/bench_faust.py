"""Faust's own ceiling on this broker: trajectory messages/s one worker consumes doing nothing with them.

    python -m bench.bench_faust [--events N] [--repeats R] [--decode]

The live pipeline's throughput target is measured against this. Per repeat, a fresh embedded broker
gets the same pre-encoded simulated run the live benchmark publishes (trajectories only), then one
Faust worker process starts with the live worker's consumer settings, and one agent takes batches
(`stream.take(2000, within=0.1)`) and counts them; with --decode it also Avro-decodes each value. The
clock runs from the first batch to the last message. For comparison, a plain kafka-python consumer
then polls the same messages (`max_poll_records` 2000), again from its first record to its last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.bench_live import STEP_SIZE, simulate
from bench.common import machine, report
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import TRAJECTORIES, create_topics


def worker(bootstrap: str, expected: int, decode: bool, out: Path) -> None:
    """Run a Faust app that counts (and maybe decodes) `expected` trajectory messages, then exits."""
    import faust

    from coevolve.schemas import default_registry
    from coevolve.services.kafka.settings import FAUST_GROUP_TIMEOUTS_S

    registry = default_registry()
    app = faust.App(f"ceiling-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}", store="memory://",
                    web_enabled=False, topic_partitions=TRAJECTORIES.partitions, topic_allow_declare=False,
                    consumer_auto_offset_reset="earliest", stream_buffer_maxsize=8000,
                    broker_max_poll_records=2000, **FAUST_GROUP_TIMEOUTS_S)
    topic = app.topic(TRAJECTORIES.name, key_serializer="raw", value_serializer="raw")
    seen = {"n": 0, "first": None}

    @app.agent(topic)
    async def count(stream):
        async for events in stream.take_events(2000, 0.1):
            if seen["first"] is None:
                seen["first"] = time.monotonic()
            if decode:
                for ev in events:
                    registry.decode(ev.value, TRAJECTORIES.name, ev.message.partition, ev.message.offset)
            seen["n"] += len(events)
            if seen["n"] >= expected:
                out.write_text(json.dumps({"n": seen["n"], "seconds": time.monotonic() - seen["first"]}))
                app._crash(SystemExit(0))

    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def plain_rate(bootstrap: str, expected: int) -> float:
    """Messages/s a kafka-python consumer polls from the trajectories topic, doing nothing with them."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(TRAJECTORIES.name, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, group_id=None, fetch_max_wait_ms=50, max_poll_records=2000)
    try:
        n, first, deadline = 0, None, time.monotonic() + 120
        while n < expected and time.monotonic() < deadline:
            for records in consumer.poll(1000).values():
                first = first or time.monotonic()
                n += len(records)
        return n / (time.monotonic() - first)
    finally:
        consumer.close()


def run(args, repeat: int, tmp: Path) -> tuple[float, float]:
    steps = max(1, args.events // STEP_SIZE)
    messages, _expected = simulate(f"ceiling-{repeat}", steps)
    trajectories = [m for m in messages if m[2] == "TrajectoryRecorded"]
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        with EventProducer(broker.bootstrap, client_id="bench") as producer:
            for topic, key, _name, _step, payload in trajectories:
                producer.send_raw(topic, payload, key, "bench")
            producer.flush()
        out = tmp / f"ceiling{repeat}.json"
        cmd = [sys.executable, "-m", "bench.bench_faust", "--worker", broker.bootstrap, str(len(trajectories)), out]
        if args.decode:
            cmd.append("--decode")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.terminate()
        proc.wait(15)
        plain = plain_rate(broker.bootstrap, len(trajectories))
    if not out.exists():
        raise RuntimeError(f"the Faust worker did not finish (exit {proc.returncode})")
    result = json.loads(out.read_text())
    size = sum(len(m[4]) for m in trajectories) / len(trajectories)
    rate = result["n"] / result["seconds"]
    print(f"run {repeat}: {result['n']} messages of {size:.0f} bytes on average in {result['seconds']:.2f} s: "
          f"Faust {rate:,.0f}/s, kafka-python {plain:,.0f}/s", flush=True)
    return rate, plain


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        bootstrap, expected, out = sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
        decode = "--decode" in sys.argv[5:]
        sys.argv = [sys.argv[0], "worker"]  # what Faust's command line expects
        worker(bootstrap, expected, decode, out)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode", action="store_true", help="Also Avro-decode every message.")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run(args, r, Path(tmp)) for r in range(args.repeats)]
    label = "Faust alone, 1 worker, take(2000)" + (", Avro decode" if args.decode else "")
    for name, rates in ((label, [r[0] for r in runs]), ("kafka-python poll alone", [r[1] for r in runs])):
        report(name, statistics.median(rates), "messages/s", rates)


if __name__ == "__main__":
    main()
