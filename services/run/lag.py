"""How far each of the run's consumer groups is behind the end of its topics (drain detection)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from coevolve.services.kafka.offsets import true_end_offsets
from coevolve.services.kafka.security import KafkaSecurity


class LagProbe:
    """Committed offsets of consumer groups against the true end offsets of their topics."""

    def __init__(self, bootstrap: str, security: KafkaSecurity | None = None):
        self.bootstrap = bootstrap
        self.security = security or KafkaSecurity.from_environment()
        options = self.security.kafka_python_options()
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="coevolve-run-lag",
                                      request_timeout_ms=10000, **options)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="coevolve-run-lag",
                                      enable_auto_commit=False, **options)

    def behind(self, groups: Mapping[str, tuple[str, Sequence[str]]]) -> dict[str, int]:
        """For each name -> (group, topics): records on the topics that the group has not committed past
        (all of them if it committed nothing). End offsets are probed once for all the topics."""
        topics = sorted({t for _, names in groups.values() for t in names})
        parts = [TopicPartition(t, p) for t in topics for p in sorted(self.consumer.partitions_for_topic(t) or ())]
        if not parts:
            return {name: 0 for name in groups}
        reported = {(tp.topic, tp.partition): end for tp, end in self.consumer.end_offsets(parts).items()}
        ends = true_end_offsets(self.bootstrap, reported, security=self.security)
        out = {}
        for name, (group, names) in groups.items():
            mine = [tp for tp in parts if tp.topic in names]
            offsets = self.admin.list_group_offsets({group: mine}).get(group, {}) if mine else {}
            committed = {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items() if meta.offset >= 0}
            out[name] = sum(max(0, (ends[(tp.topic, tp.partition)] or 0) - committed.get((tp.topic, tp.partition), 0))
                            for tp in mine)
        return out

    def lag(self, group: str, topics: Sequence[str]) -> int:
        """`behind` for one group."""
        return self.behind({group: (group, topics)})[group]

    def close(self) -> None:
        self.consumer.close()
        self.admin.close()
