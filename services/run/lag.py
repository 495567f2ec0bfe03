"""How far each of the run's consumer groups is behind the end of its topics (drain detection)."""
from __future__ import annotations

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from coevolve.services.kafka.offsets import true_end_offsets


class LagProbe:
    """Committed offsets of consumer groups against the true end offsets of their topics."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="coevolve-run-lag",
                                      request_timeout_ms=10000)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="coevolve-run-lag",
                                      enable_auto_commit=False)

    def lag(self, group: str, topics: list[str]) -> int:
        """Records on `topics` that `group` has not committed past (all of them if it committed nothing)."""
        parts = [TopicPartition(t, p) for t in topics for p in sorted(self.consumer.partitions_for_topic(t) or ())]
        if not parts:
            return 0
        reported = {(tp.topic, tp.partition): end for tp, end in self.consumer.end_offsets(parts).items()}
        ends = true_end_offsets(self.bootstrap, reported)
        offsets = self.admin.list_group_offsets({group: parts}).get(group, {})
        committed = {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items() if meta.offset >= 0}
        return sum(max(0, (end or 0) - committed.get(tp, 0)) for tp, end in ends.items())

    def close(self) -> None:
        self.consumer.close()
        self.admin.close()
