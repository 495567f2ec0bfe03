"""The kustomize tree renders, and agrees with the code: topics, commands, flags and probes."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from coevolve.services.cli import app
from coevolve.services.kafka.topics import CATALOG

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["k8s/overlays/local", "k8s/overlays/production", "k8s/jobs/replay"]
KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) is not installed")


def render(target: str) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(ROOT / target)], check=True, capture_output=True,
                         text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def containers(docs):
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                yield doc, c


def config_map(docs) -> dict:
    base = render("k8s/overlays/local")
    return next(d["data"] for d in base if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "coevolve-endpoints")


@pytest.mark.parametrize("target", ["k8s/overlays/local", "k8s/overlays/production"])
def test_kafka_topics_match_the_catalog(target):
    docs = render(target)
    topics = {d["spec"]["topicName"]: d["spec"] for d in docs if d["kind"] == "KafkaTopic"}
    assert set(topics) == set(CATALOG)
    for name, spec in topics.items():
        assert spec["partitions"] == CATALOG[name].partitions
        assert spec["config"] == CATALOG[name].configs
    replicas = {spec["replicas"] for spec in topics.values()}
    pools = [d for d in docs if d["kind"] == "KafkaNodePool"]
    assert replicas == {sum(p["spec"]["replicas"] for p in pools)}


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_runs_a_real_coevolve_command_with_flags_it_accepts(target):
    docs = render(target)
    env = config_map(docs)
    cli = get_command(app)
    checked = 0
    for _, c in containers(docs):
        if c["image"].split(":")[0] != "coevolve":
            continue
        args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
        ctx = cli.make_context("coevolve", list(args), resilient_parsing=False)
        with ctx:
            sub = ctx.command
            rest = args
            while hasattr(sub, "commands"):  # walk groups down to the leaf command
                name, rest = rest[0], rest[1:]
                sub = sub.commands[name]
            sub.make_context(name, list(rest), parent=ctx)
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("target", ["k8s/overlays/local", "k8s/overlays/production"])
def test_services_probe_the_health_endpoint_they_serve(target):
    docs = render(target)
    deployments = [(d, c) for d, c in containers(docs) if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d, _ in deployments} >= {"streams-worker", "archiver"}
    for _, c in deployments:
        port = str(next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics"))
        args = c["args"]
        assert args[args.index("--metrics-port") + 1] == port
        assert args[args.index("--metrics-host") + 1] == "0.0.0.0"
        for probe in (c["livenessProbe"], c["readinessProbe"]):
            assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert {"configMapRef": {"name": "coevolve-endpoints"}} in c["envFrom"]


def test_services_reach_kafka_through_the_strimzi_bootstrap_service():
    docs = render("k8s/overlays/local")
    cluster = next(d["metadata"]["name"] for d in docs if d["kind"] == "Kafka")
    listener = next(d["spec"]["kafka"]["listeners"][0] for d in docs if d["kind"] == "Kafka")
    assert config_map(docs)["KAFKA_BOOTSTRAP"] == f"{cluster}-kafka-bootstrap:{listener['port']}"
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "clickhouse")
    assert config_map(docs)["CLICKHOUSE_URL"] == f"http://clickhouse:{service['spec']['ports'][0]['port']}"
