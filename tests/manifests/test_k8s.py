"""The kustomize tree agrees with the code: topics, config, commands and flags, probes, endpoints."""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from typer.main import get_command

from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.kafka.topics import CATALOG, TRAJECTORIES
from coevolve.services.cli import app
from coevolve.services.runtime.config import load
from coevolve.streams.worker.app import internal_topics as repartitioned
from coevolve.streams.worker.config import StreamsConfig
from tests.kustomize import (JOBS, KUBECTL, OVERLAYS, ROOT, TARGETS, coevolve_argv, command_of, container_env,
                             containers, expand, find, loaded_configs, pods, render, with_mounted_files)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) is not installed")


def config(docs) -> dict:
    return find(docs, "ConfigMap", "coevolve-config")["data"]


def internal_topics(app_id: str) -> dict[str, tuple[int, bool]]:
    """The signal workers' own topics, read off the Faust app: name -> (partitions, compacted)."""
    from coevolve.streams.worker.app import build_app
    from coevolve.streams.worker.metrics import Metrics

    faust_app = build_app(StreamsConfig(app_id=app_id), Metrics())
    topics = {t.name: (t.partitions, False) for t in repartitioned(app_id).values()}
    for table in faust_app.tables.values():
        topics[table.changelog_topic.get_topic_name()] = (table.partitions, table.changelog_topic.compacting)
    topics[faust_app._leader_assignor._leader_topic_name] = (1, False)  # Faust names it only here
    return topics


@pytest.mark.parametrize("target", OVERLAYS)
def test_kafka_topics_are_the_catalog_and_the_workers_own_topics(target):
    docs = render(target)
    topics = {d["spec"]["topicName"]: d["spec"] for d in docs if d["kind"] == "KafkaTopic"}
    internal = internal_topics(config(docs)["STREAMS_APP_ID"])
    assert set(topics) == set(CATALOG) | set(internal)
    for name, topic in CATALOG.items():
        assert topics[name]["partitions"] == topic.partitions
        assert topics[name]["config"] == topic.configs
    for name, (partitions, compacted) in internal.items():
        assert topics[name]["partitions"] == partitions
        assert (topics[name].get("config", {}).get("cleanup.policy") == "compact") == compacted
    for topic in repartitioned(config(docs)["STREAMS_APP_ID"]).values():  # the ticks' topics expire
        assert topics[topic.name]["config"] == topic.configs and topic.configs["retention.ms"]
    brokers = sum(p["spec"]["replicas"] for p in docs
                  if p["kind"] == "KafkaNodePool" and "broker" in p["spec"]["roles"])
    assert {spec["replicas"] for spec in topics.values()} == {brokers}
    kafka_config = next(d for d in docs if d["kind"] == "Kafka")["spec"]["kafka"]["config"]
    assert kafka_config["min.insync.replicas"] <= brokers
    assert kafka_config["min.insync.replicas"] < brokers or brokers == 1  # one broker down still writes


@pytest.mark.parametrize("target", OVERLAYS)
def test_every_config_map_key_is_read_and_valid(target, tmp_path):
    from coevolve.services.archive.config import ArchiverConfig

    docs = render(target)
    data = config(docs)
    fields = {}  # PREFIX_FIELD -> (the value loaded, the value given)
    shared = {"KAFKA_BOOTSTRAP"} | {f.upper() for f in KafkaSecurity.__dataclass_fields__}
    for workload, c in containers(docs):
        argv = coevolve_argv(c, docs)
        for cls, prefix in loaded_configs(command_of(argv)[1]) if argv else []:
            given = with_mounted_files(data, workload, c, docs, tmp_path)
            cfg = load(cls, prefix, environ=given)
            fields.update({f"{prefix}_{name}".upper(): (getattr(cfg, name), given.get(f"{prefix}_{name}".upper()))
                           for name in cls.__dataclass_fields__})
    referenced = {ref for _, c in containers(docs) for ref in re.findall(r"\$\((\w+)\)", " ".join(c.get("args", [])))}
    referenced |= {v["valueFrom"]["configMapKeyRef"]["key"] for _, c in containers(docs) for v in c.get("env", [])
                   if "configMapKeyRef" in v.get("valueFrom", {})}
    for key in data:
        if key in fields:  # the layering read it, converted to the field's type
            loaded, given = fields[key]
            assert str(loaded) == given or loaded == type(loaded)(given), key
        elif key not in shared:  # read by every service's Kafka clients (checked below)
            assert key in referenced, f"{key} is read by nothing"
    assert load(ArchiverConfig, "archiver", environ=data).topic_list == list(CATALOG)
    sasl = data.get("KAFKA_SECURITY_PROTOCOL", "").startswith("SASL_")
    own = {"KAFKA_SASL_USERNAME": "user", "KAFKA_SASL_PASSWORD": "password"} if sasl else {}  # each workload's
    security = KafkaSecurity.from_environment({**data, **own})
    assert all(str(getattr(security, key.lower())) == data[key] for key in set(data) & shared - {"KAFKA_BOOTSTRAP"})
    assert not any(word in key.lower() for key in data for word in ("password", "secret", "token", "api_key"))


def test_the_replay_job_defaults_to_the_live_workers_thresholds():
    live = load(StreamsConfig, "streams", environ=config(render("k8s/overlays/local")))
    docs = render("k8s/jobs/replay")
    _, job = next(containers(docs))
    args = expand(job["args"], container_env(job, docs))
    flags = {"--window": live.window, "--success-threshold": live.success_threshold,
             "--rare-threshold": live.rare_threshold, "--pattern-length": live.pattern_length}
    for flag, value in flags.items():
        assert float(args[args.index(flag) + 1]) == value, flag


def test_a_replay_with_new_thresholds_is_an_overlay_with_a_name_suffix(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(ROOT / 'k8s/jobs/replay', tmp_path)}]\n"
        "nameSuffix: -tau07\n"
        "configMapGenerator:\n"
        "  - name: replay-args\n    behavior: merge\n"
        "    literals: [SUCCESS_THRESHOLD=0.7, OUTPUT=/results/signals-tau07.jsonl]\n")
    docs = render(str(tmp_path))
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["metadata"]["name"] == "replay-tau07"
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = expand(container["args"], container_env(container, docs))
    assert args[args.index("--success-threshold") + 1] == "0.7"
    assert args[args.index("--window") + 1] == "5"
    assert args[args.index("--output") + 1] == "/results/signals-tau07.jsonl"
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "replay-results"


def coevolve_commands():
    """(target, argv) of every container that runs the `coevolve` entry point, launched or not."""
    for target in TARGETS:
        docs = render(target)
        for workload, c in containers(docs):
            argv = coevolve_argv(c, docs)
            if argv is not None:
                yield pytest.param(target, argv, id=f"{target.split('/')[-1]}-{workload['metadata']['name']}")


@pytest.mark.parametrize(("target", "args"), list(coevolve_commands()))
def test_every_container_runs_a_real_coevolve_command_with_flags_it_accepts(target, args):
    cli = get_command(app)
    path, command, rest = command_of(args)
    with cli.make_context("coevolve", list(args), resilient_parsing=False) as ctx:
        command.make_context(path[-1], list(rest), parent=ctx)
    started = subprocess.run([sys.executable, "-c", "from coevolve.services.cli import main; main()", *path,
                              "--help"], capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr


@pytest.mark.parametrize("target", OVERLAYS)
def test_services_probe_the_health_endpoint_they_serve(target):
    docs = render(target)
    services = {d["metadata"]["name"]: c for d, c in containers(docs)
                if d["kind"] == "Deployment" or d["metadata"]["name"] == "learner"}
    assert set(services) >= {"streams-worker", "archiver", "vllm-server", "explorer", "validator", "learner"}
    for name, c in services.items():
        probes = [c[p] for p in ("livenessProbe", "readinessProbe", "startupProbe") if p in c]
        assert len(probes) >= 2 and "livenessProbe" in c, name
        args = coevolve_argv(c, docs)
        if args is None:  # vLLM's own server: /health on its API port
            assert all(p["httpGet"] == {"path": "/health", "port": "http"} for p in probes)
            continue
        port = str(next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics"))
        assert args[args.index("--metrics-port") + 1] == port
        assert args[args.index("--metrics-host") + 1] == "0.0.0.0"
        assert all(p["httpGet"] == {"path": "/healthz", "port": "metrics"} for p in probes)
        assert {"configMapRef": {"name": "coevolve-config"}} in c["envFrom"]


@pytest.mark.parametrize("target", OVERLAYS)
def test_the_vllm_server_serves_the_configured_model_from_its_volume_offline(target):
    docs = render(target)
    spec = find(docs, "Deployment", "vllm-server")["spec"]["template"]["spec"]
    c = spec["containers"][0]
    env = container_env(c, docs)
    args = expand(c["args"], env)
    assert c["command"] == ["vllm", "serve"]
    assert args[0] == f"/models/{config(docs)['LLM_MODEL']}"
    assert args[args.index("--served-model-name") + 1] == config(docs)["LLM_MODEL"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/models")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] and volume["persistentVolumeClaim"]["claimName"] == "models"
    assert env["HF_HUB_OFFLINE"] == "1"
    key = {"secretKeyRef": {"name": "coevolve-llm", "key": "api-key"}}
    assert {"name": "VLLM_API_KEY", "valueFrom": key} in c["env"]
    gpu = c["resources"]["limits"].get("nvidia.com/gpu")
    assert (c["image"].startswith("coevolve-gpu:"), gpu) == ((True, "1") if "production" in target else (False, None))
    assert ("VLLM_CPU_KVCACHE_SPACE" in env) == (gpu is None)


def test_local_is_cpu_only_with_the_tiny_model():
    docs = render("k8s/overlays/local")
    assert config(docs)["LLM_MODEL"] == "tiny-random"
    assert not any("nvidia.com/gpu" in c["resources"].get("limits", {}) for _, c in containers(docs))


def test_services_find_kafka_clickhouse_and_the_llm_through_their_services():
    docs = render("k8s/overlays/local")
    kafka = next(d for d in docs if d["kind"] == "Kafka")
    listener = kafka["spec"]["kafka"]["listeners"][0]
    assert config(docs)["KAFKA_BOOTSTRAP"] == f"{kafka['metadata']['name']}-kafka-bootstrap:{listener['port']}"
    vllm = find(docs, "Service", "vllm-server")["spec"]["ports"][0]["port"]
    assert config(docs)["LLM_BASE_URL"] == f"http://vllm-server:{vllm}/v1"
    clickhouse = find(docs, "Service", "clickhouse")["spec"]["ports"][0]["port"]
    users = ET.fromstring(find(docs, "ConfigMap", "clickhouse-server-config")["data"]["coevolve-user.xml"])
    user = users.find("users/coevolve")
    server = find(docs, "StatefulSet", "clickhouse")["spec"]["template"]["spec"]["containers"][0]
    password_env = user.find("password").get("from_env")
    assert container_env(server, docs)[password_env] == "password"  # from the Secret's password key
    deploy = (ROOT / "docs/deploy.md").read_text()
    assert f"url=http://{user.tag}:$PASSWORD@clickhouse:{clickhouse}" in deploy  # how the URL Secret is made


@pytest.mark.parametrize("target", TARGETS)
def test_pods_carry_exactly_the_role_labels_their_network_flows_need(target):
    docs = render(target)
    for workload, spec in pods(docs):
        labels, name = workload["spec"]["template"]["metadata"]["labels"], workload["metadata"]["name"]
        env = {k for c in spec["containers"] for k in container_env(c, docs)}
        # replay publishes its signals to Kafka when given --publish (replay produces signals).
        kafka = "KAFKA_BOOTSTRAP" in env or spec["containers"][0].get("args", [""])[0] == "replay"
        assert (labels.get("coevolve.io/kafka-client") == "true") == kafka, name
        assert (labels.get("coevolve.io/clickhouse-client") == "true") == ("CLICKHOUSE_URL" in env), name
    if target in OVERLAYS:
        peers = next(d for d in docs if d["kind"] == "Kafka")["spec"]["kafka"]["listeners"][0]["networkPolicyPeers"]
        assert peers == [{"podSelector": {"matchLabels": {"coevolve.io/kafka-client": "true"}}}]
        deny = find(docs, "NetworkPolicy", "default-deny")["spec"]
        assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        clickhouse = find(docs, "NetworkPolicy", "clickhouse")["spec"]["ingress"][0]
        assert clickhouse["from"] == [{"podSelector": {"matchLabels": {"coevolve.io/clickhouse-client": "true"}}}]


@pytest.mark.parametrize("target", TARGETS)
def test_every_workload_is_hardened(target):
    docs = render(target)
    uid = next(line.split()[1].split(":")[0] for line in (ROOT / "Dockerfile").read_text().splitlines()
               if line.startswith("USER "))
    for workload, spec in pods(docs):
        name = workload["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is False, name
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] and pod["runAsUser"] >= 10000 and pod["seccompProfile"] == {"type": "RuntimeDefault"}
        writable = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v or "persistentVolumeClaim" in v}
        writable |= {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for c in spec["containers"]:
            if c["image"].startswith("coevolve"):
                assert str(pod["runAsUser"]) == uid, f"{name} runs as another user than the image's"
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}, name
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{name} {kind}"
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", []) if not m.get("readOnly")}
            assert "/tmp" in mounts and set(mounts.values()) - {"server-config"} <= writable, name


@pytest.mark.parametrize("target", OVERLAYS)
def test_long_running_workers_have_disruption_budgets(target):
    """Workers that may run several replicas keep some through a drain; a singleton replaced rather
    than rolled (explorer, validator) has no budget: with one replica it would protect nothing."""
    docs = render(target)
    budgets = [d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "PodDisruptionBudget"]
    for d in docs:
        if d["kind"] == "Deployment":
            singleton = d["spec"].get("strategy", {}).get("type") == "Recreate"
            assert (d["spec"]["selector"]["matchLabels"] in budgets) != singleton, d["metadata"]["name"]
            assert not singleton or d["spec"]["replicas"] == 1, d["metadata"]["name"]


def test_production_scales_signal_workers_up_to_the_trajectory_partitions():
    docs = render("k8s/overlays/production")
    hpa = find(docs, "HorizontalPodAutoscaler", "streams-worker")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "streams-worker"
    assert 1 < hpa["minReplicas"] <= hpa["maxReplicas"] == TRAJECTORIES.partitions
    assert "replicas" not in find(docs, "Deployment", "streams-worker")["spec"]  # the HPA owns the count


@pytest.mark.parametrize("target", OVERLAYS)
def test_signal_workers_create_topics_with_the_clusters_replication(target):
    docs = render(target)
    streams = load(StreamsConfig, "streams", environ=config(docs))
    brokers = sum(p["spec"]["replicas"] for p in docs
                  if p["kind"] == "KafkaNodePool" and "broker" in p["spec"]["roles"])
    kafka_config = next(d for d in docs if d["kind"] == "Kafka")["spec"]["kafka"]["config"]
    assert streams.replication_factor == brokers
    assert streams.replication_factor >= kafka_config.get("min.insync.replicas", 1)


@pytest.mark.parametrize("job", JOBS)
def test_jobs_read_the_archive_url_from_the_secret_never_from_their_arguments(job):
    docs = render(job)
    for _, c in containers(docs):
        assert not any("CLICKHOUSE" in arg or arg == "--clickhouse" for arg in c["args"]), c["args"]
        url = next(v for v in c["env"] if v["name"] == "CLICKHOUSE_URL")
        assert url["valueFrom"] == {"secretKeyRef": {"name": "coevolve-clickhouse", "key": "url"}}


def test_every_job_template_renders_on_its_own():
    assert JOBS and all(any(d["kind"] == "Job" for d in render(job)) for job in JOBS)


@pytest.mark.parametrize("target", OVERLAYS)
def test_only_llm_clients_reach_the_vllm_server(target):
    docs = render(target)
    labels = find(docs, "Deployment", "vllm-server")["spec"]["template"]["metadata"]["labels"]
    sources = [rule.get("from") for d in docs if d["kind"] == "NetworkPolicy"
               if all(labels.get(k) == v for k, v in d["spec"]["podSelector"].get("matchLabels", {}).items())
               for rule in d["spec"].get("ingress", [])]
    assert sources == [[{"podSelector": {"matchLabels": {"coevolve.io/llm-client": "true"}}}]]
