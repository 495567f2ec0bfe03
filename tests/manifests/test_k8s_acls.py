"""The production broker admits only who must write: an authenticated TLS listener, the simple
authorizer, and one KafkaUser per client whose ACLs are what its code reads and writes."""
import os

import pytest

from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.kafka.topics import (CATALOG, DEADLETTER, EVALUATIONS, EXPLORATIONS, SIGNALS, STEPS, TASKS,
                                            TRAJECTORIES, WRITES)
from coevolve.services.runtime.config import load
from tests.kustomize import (KAFKA_USER_STANDIN, KUBECTL, coevolve_argv, command_of, container_env, containers,
                             find, loaded_configs, render, with_mounted_files)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) is not installed")
PRODUCTION = "k8s/overlays/production"
CLUSTER_CA = ("coevolve-cluster-ca-cert", "ca.crt")  # Strimzi's Secret of the cluster CA, and its key
# What each client writes is the table its producers enforce (topics.WRITES); what it reads and its group
# are read off its config below.
READS = {"learner": {TASKS.name}, "streams-worker": {TRAJECTORIES.name, STEPS.name},
         "explorer": {SIGNALS.name, STEPS.name, TASKS.name}, "validator": {EXPLORATIONS.name, TASKS.name}}


@pytest.fixture(scope="module")
def docs():
    return render(PRODUCTION)


def users(docs) -> dict[str, list[dict]]:
    """KafkaUser name -> its ACL rules."""
    return {d["metadata"]["name"]: d["spec"]["authorization"]["acls"] for d in docs if d["kind"] == "KafkaUser"}


def allows(rules: list[dict], kind: str, name: str, operation: str) -> bool:
    """Whether the rules let `operation` on the resource, as Kafka matches them (literal, `*`, prefix)."""
    for rule in rules:
        resource = rule["resource"]
        if resource["type"] != kind or rule.get("type", "allow") != "allow":
            continue
        pattern, pattern_type = resource["name"], resource.get("patternType", "literal")
        matches = name.startswith(pattern) if pattern_type == "prefix" else pattern in (name, "*")
        if matches and (operation in rule["operations"] or "All" in rule["operations"]):
            return True
    return False


def topics(docs) -> set[str]:
    """Every topic of the cluster: the catalog and the workers' own (test_k8s keeps both equal to the code)."""
    return {d["spec"]["topicName"] for d in docs if d["kind"] == "KafkaTopic"}


def app_id(docs) -> str:
    return find(docs, "ConfigMap", "coevolve-config")["data"]["STREAMS_APP_ID"]


def writers(docs, topic: str) -> set[str]:
    return {user for user, rules in users(docs).items() if allows(rules, "topic", topic, "Write")}


def kafka_clients(docs, tmp_path):
    """(workload, container, configs loaded from its environment) of every service that talks to Kafka."""
    for workload, c in containers(docs):
        argv = coevolve_argv(c, docs)
        if argv is None:
            continue
        env = with_mounted_files(container_env(c, docs), workload, c, docs, tmp_path)
        loaded = [(load(cls, prefix, environ=env), prefix) for cls, prefix in loaded_configs(command_of(argv)[1])]
        if any(hasattr(cfg, "kafka_bootstrap") for cfg, _ in loaded):
            yield workload, c, loaded


def test_the_listener_requires_scram_over_tls_and_the_simple_authorizer(docs):
    kafka = next(d for d in docs if d["kind"] == "Kafka")["spec"]
    listeners = kafka["kafka"]["listeners"]
    assert listeners and all(lst["tls"] and lst["authentication"]["type"] == "scram-sha-512" for lst in listeners)
    assert kafka["kafka"]["authorization"] == {"type": "simple"}  # no superUsers beyond Strimzi's own
    assert "userOperator" in kafka["entityOperator"]  # it makes the users' Secrets and ACLs
    port = listeners[0]["port"]
    data = find(docs, "ConfigMap", "coevolve-config")["data"]
    assert data["KAFKA_BOOTSTRAP"] == f"coevolve-kafka-bootstrap:{port}"
    egress = find(docs, "NetworkPolicy", "kafka-clients")["spec"]["egress"]
    assert [p["port"] for rule in egress for p in rule["ports"]] == [port]


def test_only_the_validator_writes_tasks_and_only_the_learner_its_events(docs):
    assert writers(docs, TASKS.name) == {"validator"}
    for topic in (TRAJECTORIES.name, STEPS.name, EVALUATIONS.name):
        assert writers(docs, topic) == {"learner"}, topic
    assert writers(docs, SIGNALS.name) == {"streams-worker"}
    assert writers(docs, EXPLORATIONS.name) == {"explorer"}
    assert writers(docs, DEADLETTER.name) == {"learner", "streams-worker", "explorer", "validator", "archiver"}


def test_the_signal_workers_alone_own_their_internal_topics_and_group(docs):
    internal = {t for t in topics(docs) if t not in CATALOG}
    assert internal and all(t.startswith(app_id(docs) + "-") for t in internal)
    for topic in internal:
        assert writers(docs, topic) == {"streams-worker"}, topic
        assert {u for u, rules in users(docs).items() if allows(rules, "topic", topic, "Read")} == {"streams-worker"}
    assert {u for u, rules in users(docs).items() if allows(rules, "group", app_id(docs), "Read")} == {"streams-worker"}


@pytest.mark.parametrize("user", ["explorer", "archiver", "learner", "validator", "streams-worker"])
def test_each_client_writes_exactly_its_topics(docs, user):
    rules = users(docs)[user]
    own = {t for t in topics(docs) if t.startswith(app_id(docs) + "-")} if user == "streams-worker" else set()
    assert {t for t in topics(docs) if allows(rules, "topic", t, "Write")} == WRITES[user] | own


def test_each_client_reads_its_topics_and_group_and_nothing_more(docs, tmp_path):
    seen = set()
    for workload, _, loaded in kafka_clients(docs, tmp_path):
        configs = [cfg for cfg, _ in loaded]
        name = workload["metadata"]["name"]
        rules, seen = users(docs)[name], seen | {name}
        groups = {cfg.group(prefix) for cfg, prefix in loaded if hasattr(cfg, "group")}
        reads = {t for cfg in configs for t in getattr(cfg, "topic_list", [])} or READS[name]  # the archiver: all
        own = {t for t in topics(docs) if t.startswith(app_id(docs) + "-")} if name == "streams-worker" else set()
        assert {t for t in topics(docs) if allows(rules, "topic", t, "Read")} == reads | own, name
        assert {r["resource"]["name"] for r in rules if r["resource"]["type"] == "group"} == groups, name
        assert all(r["operations"] == ["Read"] for r in rules if r["resource"]["type"] == "group"), name
        # Describe (metadata, end offsets) wherever it reads or writes.
        assert all(allows(rules, "topic", t, "Describe") for t in reads | WRITES[name] | own), name
    assert seen == set(users(docs)) == set(WRITES)


def test_no_rule_creates_deletes_alters_or_reaches_the_cluster(docs):
    for user, rules in users(docs).items():
        for rule in rules:
            assert set(rule["operations"]) <= {"Read", "Write", "Describe"}, (user, rule)
            assert rule["resource"]["type"] in ("topic", "group") and rule["resource"]["name"] != "*", (user, rule)
            assert rule.get("type", "allow") == "allow"


def test_every_client_speaks_as_its_own_user_with_the_cluster_ca(docs, tmp_path):
    listener = next(d for d in docs if d["kind"] == "Kafka")["spec"]["kafka"]["listeners"][0]
    for workload, c, _ in kafka_clients(docs, tmp_path):
        name = workload["metadata"]["name"]
        env = {v["name"]: v for v in c["env"]}
        assert env["KAFKA_SASL_USERNAME"] == {"name": "KAFKA_SASL_USERNAME", "value": name}
        assert env["KAFKA_SASL_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": name, "key": "password"}}
        security = KafkaSecurity.from_environment(container_env(c, docs))
        assert (security.kafka_security_protocol, security.kafka_sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
        assert listener["authentication"]["type"] == security.kafka_sasl_mechanism.lower()
        assert (security.kafka_sasl_username, security.kafka_sasl_password) == (name, KAFKA_USER_STANDIN)
        folder, file = os.path.split(security.kafka_ssl_cafile)
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == folder)
        volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        assert mount["readOnly"] and volume["secret"]["secretName"] == CLUSTER_CA[0]
        assert volume["secret"]["items"] == [{"key": CLUSTER_CA[1], "path": file}]


def test_local_stays_plaintext_without_users():
    docs = render("k8s/overlays/local")
    kafka = next(d for d in docs if d["kind"] == "Kafka")["spec"]["kafka"]
    assert "authorization" not in kafka and not any(lst.get("authentication") for lst in kafka["listeners"])
    assert not users(docs)
    data = find(docs, "ConfigMap", "coevolve-config")["data"]
    assert KafkaSecurity.from_environment(data).kafka_security_protocol == "PLAINTEXT"
