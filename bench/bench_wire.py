"""Wire-format and producer throughput: encode, decode, and publish to the embedded broker.

    python -m bench.bench_wire [--events N] [--repeats R]
"""
from __future__ import annotations

import argparse

from bench.common import machine, median_rate, report
from coevolve.schemas import default_registry
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import create_topics
from coevolve.services.simulate import SimulationConfig, Simulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    registry = default_registry()
    steps = max(1, args.events // 128)
    trajectories = [e for _, _, n, e in Simulator(SimulationConfig(steps=steps, synthesized_per_step=0)).events()
                    if n == "TrajectoryRecorded"][: args.events]
    encoded = [registry.encode("TrajectoryRecorded", e) for e in trajectories]
    size = sum(map(len, encoded)) / len(encoded)
    print(f"machine: {machine()}")
    print(f"{len(trajectories)} TrajectoryRecorded events, {size:.0f} bytes each on the wire")

    def encode() -> int:
        for e in trajectories:
            registry.encode("TrajectoryRecorded", e)
        return len(trajectories)

    def decode() -> int:
        for data in encoded:
            registry.decode(data)
        return len(encoded)

    rate, runs = median_rate(encode, args.repeats)
    report("encode", rate, "events/s", runs)
    rate, runs = median_rate(decode, args.repeats)
    report("decode", rate, "events/s", runs)

    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        producer = EventProducer(broker.bootstrap, client_id="bench")

        def publish() -> int:
            for e in trajectories:
                producer.send("coevolve.trajectories", e, key=e["task_id"])
            return producer.flush()

        rate, runs = median_rate(publish, args.repeats)
        report("publish (acks=all, confirmed)", rate, "events/s", runs)
        producer.close()


if __name__ == "__main__":
    main()
