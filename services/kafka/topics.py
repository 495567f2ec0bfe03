"""The topic catalog: names, events, partitions and configs, in one place (docs/events.md)."""
from __future__ import annotations

from dataclasses import dataclass, field

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.runtime.log import get_logger

log = get_logger("topics")


@dataclass(frozen=True)
class Topic:
    name: str
    event: str
    key: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}

TRAJECTORIES = Topic("coevolve.trajectories", "TrajectoryRecorded", "task_id", 4, KEEP_FOREVER)
STEPS = Topic("coevolve.steps", "StepCompleted", "run_id", 1, KEEP_FOREVER)
SIGNALS = Topic("coevolve.signals", "SignalRaised", "task_id or pattern", 4, KEEP_FOREVER)
EXPLORATIONS = Topic("coevolve.explorations", "ExplorationRecorded", "task_id", 4, KEEP_FOREVER)
TASKS = Topic("coevolve.tasks", "TaskChecked", "task_id", 4, {"cleanup.policy": "compact"})
DEADLETTER = Topic("coevolve.deadletter", "DeadLettered", "source topic", 1, KEEP_FOREVER)
EVALUATIONS = Topic("coevolve.evaluations", "EvaluationCompleted", "run_id", 1, KEEP_FOREVER)
POLICY = Topic("coevolve.policy", "PolicyUpdated", "run_id", 1, KEEP_FOREVER)

CATALOG: dict[str, Topic] = {t.name: t for t in (TRAJECTORIES, STEPS, SIGNALS, EXPLORATIONS, TASKS, EVALUATIONS,
                                                         POLICY, DEADLETTER)}

# What each service's code writes, the one table its producers and the production ACLs both read: a
# producer made for a service refuses any other topic (`EventProducer(..., service=...)`, the signal
# workers' `Emitter`), and tests/manifests/test_k8s_acls.py checks that each KafkaUser may write exactly these.
WRITES: dict[str, frozenset[str]] = {
    "learner": frozenset({TRAJECTORIES.name, STEPS.name, EVALUATIONS.name, POLICY.name, DEADLETTER.name}),
    "streams-worker": frozenset({SIGNALS.name, DEADLETTER.name}),
    "explorer": frozenset({EXPLORATIONS.name, DEADLETTER.name}),
    "validator": frozenset({TASKS.name, DEADLETTER.name}),
    "archiver": frozenset({DEADLETTER.name}),
}


class NotWritable(ValueError):
    """A service's code sent to a topic its row of WRITES (and so its production KafkaUser) does not name."""


def check_write(service: str, topic: str) -> None:
    if topic not in WRITES[service]:
        raise NotWritable(f"the {service} wrote {topic}, which its Kafka user may not write in production; add "
                          f"the topic to its row of WRITES (services/kafka/topics.py) and to its KafkaUser "
                          f"(k8s/overlays/production/kafka-users.yaml), or send it elsewhere")


def create_topics(bootstrap: str, topics: list[Topic] | None = None,
                  replication_factor: int = 1, security: KafkaSecurity | None = None) -> list[str]:
    """Create the catalog's missing topics; return the names created. Idempotent."""
    topics = list(CATALOG.values()) if topics is None else topics
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="coevolve-topics",
                             request_timeout_ms=10000,
                             **(security or KafkaSecurity.from_environment()).kafka_python_options())
    try:
        existing = set(admin.list_topics())
        created = []
        for topic in topics:
            if topic.name in existing:
                continue
            try:
                admin.create_topics([NewTopic(topic.name, topic.partitions, replication_factor,
                                              topic_configs=dict(topic.configs))])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass  # another process created it between list and create
        log.info("topics.ensured", bootstrap=bootstrap, created=created)
        return created
    finally:
        admin.close()
