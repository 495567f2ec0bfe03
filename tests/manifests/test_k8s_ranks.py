"""The production learner across nodes: an indexed Job of one pod per node that find each other through a
headless Service, talk on the ports a NetworkPolicy opens between them alone, share their checkpoint
volume, and tell a finished run from a stopped or failed one by their exit codes."""
import json
import subprocess

import pytest

from coevolve.services.learner.config import RanksConfig
from coevolve.services.runtime.config import ConfigError, load
from tests.kustomize import COMPLETION_INDEX, KUBECTL, container_env, find, render
from tests.manifests.test_k8s_fleet import INDEX_LABEL, admitted, indexed_pods, policies, selects, workloads

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) is not installed")
PRODUCTION = "k8s/overlays/production"
EPHEMERAL = set(range(32768, 61000))  # where NCCL and gloo listen (the kernel picks the port)


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(PRODUCTION)


def learner(docs) -> tuple[dict, dict, dict]:
    """(Job, pod spec, learner container)."""
    job = find(docs, "Job", "learner")
    spec = job["spec"]["template"]["spec"]
    return job, spec, next(c for c in spec["containers"] if c["name"] == "learner")


def ranks(docs, index: int = 0) -> RanksConfig:
    """The ranks settings the learner of pod `index` loads from its environment."""
    _, _, c = learner(docs)
    return load(RanksConfig, "learner", environ=container_env(c, docs, fields={COMPLETION_INDEX: str(index)}))


def test_the_learner_is_an_indexed_job_of_one_pod_per_node(docs):
    job, spec, _ = learner(docs)
    nnodes = ranks(docs).nnodes
    assert nnodes > 1
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nnodes  # all ranks at once
    labels = job["spec"]["template"]["metadata"]["labels"]
    terms = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert any(t["topologyKey"] == "kubernetes.io/hostname" and selects(t["labelSelector"], labels) for t in terms)


def test_each_pods_node_rank_is_its_completion_index(docs):
    _, _, c = learner(docs)
    var = next(v for v in c["env"] if v["name"] == "LEARNER_NODE_RANK")
    assert var["valueFrom"] == {"fieldRef": {"fieldPath": COMPLETION_INDEX}}
    nnodes = ranks(docs).nnodes
    assert [ranks(docs, i).node_rank for i in range(nnodes)] == list(range(nnodes))
    with pytest.raises(ConfigError, match="node_rank"):  # an index past the Job's would be refused
        ranks(docs, nnodes)


def test_each_pod_has_one_gpu_per_rank_it_runs(docs):
    _, _, c = learner(docs)
    per_node = ranks(docs).per_node
    assert ranks(docs).world_size == per_node * ranks(docs).nnodes
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == str(per_node)


def test_the_rendezvous_is_pod_0_of_a_headless_service_of_the_learners_pods(docs):
    job, spec, c = learner(docs)
    service = find(docs, "Service", spec["subdomain"])["spec"]
    # A DNS name per pod, resolving before the pods are ready: the rendezvous precedes the first step.
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    chosen = [name for _, name, labels in workloads(docs) if selects({"matchLabels": service["selector"]}, labels)]
    assert chosen == ["learner"]
    host, port = ranks(docs).rdzv_endpoint.split(":")
    assert host == f"{job['metadata']['name']}-0.{spec['subdomain']}"  # an indexed Job's pod 0 hostname
    rendezvous = next(p for p in service["ports"] if p["port"] == int(port))
    assert rendezvous["targetPort"] in {p["name"] for p in c["ports"] if p["containerPort"] == int(port)}


def test_only_learner_pods_reach_each_other_on_the_rendezvous_and_collective_ports(docs):
    _, _, c = learner(docs)
    labels = find(docs, "Job", "learner")["spec"]["template"]["metadata"]["labels"]
    port = int(ranks(docs).rdzv_endpoint.split(":")[1])
    assert admitted(docs, labels, labels) == {port} | EPHEMERAL
    for kind, name, other in workloads(docs):
        if name == "learner":
            continue
        reach = admitted(docs, other, labels)
        assert port not in reach, f"{kind} {name} reaches the rendezvous"
        # The fleet's servers reach the learner for the weight transfer (test_k8s_fleet.py); nobody else.
        assert not reach or name == "rollout-fleet", f"{kind} {name} reaches the learner on {sorted(reach)[:3]}"
    # No rule admits the rendezvous port from anywhere else (another namespace, an address block).
    for rule in policies(docs, labels, "ingress"):
        opened = {n for p in rule["ports"] for n in range(p["port"], p.get("endPort", p["port"]) + 1)}
        if port in opened:
            assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "learner"}}}]


def test_every_rank_serves_metrics_on_a_port_the_pod_declares_and_monitoring_may_scrape(docs):
    _, _, c = learner(docs)
    labels = find(docs, "Job", "learner")["spec"]["template"]["metadata"]["labels"]
    declared = {p["containerPort"] for p in c["ports"]}
    first = next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics")
    scraped = set()
    for rule in policies(docs, labels, "ingress"):
        if {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in rule["from"]:
            scraped |= {n for p in rule["ports"] for n in range(p["port"], p.get("endPort", p["port"]) + 1)}
    per_rank = {first + r for r in range(ranks(docs).per_node)}
    assert per_rank <= declared and per_rank <= scraped
    assert max(scraped) < 29400  # the rendezvous is not scraped


def test_the_transfer_rendezvous_selects_pod_0_alone(docs):
    """Rank 0, on pod 0, hosts the fleet's weight transfer: learner-transfer must resolve to that pod."""
    job, _, _ = learner(docs)
    service = find(docs, "Service", find(docs, "ConfigMap", "coevolve-config")["data"]["LEARNER_TRANSFER_HOST"])
    selector = {"matchLabels": service["spec"]["selector"]}
    chosen = [p[INDEX_LABEL] for p in indexed_pods(job) if selects(selector, p)]
    assert chosen == ["0"] and len(indexed_pods(job)) == ranks(docs).nnodes


def test_checkpoints_and_models_are_on_volumes_every_node_mounts(docs):
    _, spec, c = learner(docs)
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/data/learner")
    claim = next(v for v in spec["volumes"] if v["name"] == mount["name"])["persistentVolumeClaim"]["claimName"]
    assert not mount.get("readOnly")  # every rank writes its shard into the same checkpoint folder
    assert find(docs, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]
    models = find(docs, "PersistentVolumeClaim", "models")["spec"]["accessModes"]
    assert models in (["ReadWriteMany"], ["ReadOnlyMany"])
    # No affinity pins a pod to a node an RWO volume would need: the anti-affinity alone places them.
    assert set(spec["affinity"]) == {"podAntiAffinity"}


def test_the_job_succeeds_with_pod_0_and_retries_a_failed_gang(docs):
    job, _, _ = learner(docs)
    local = find(render("k8s/overlays/local"), "Job", "learner")["spec"]
    nnodes = ranks(docs).nnodes
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    # Every pod of a failed attempt fails: as many attempts as the single pod has.
    assert job["spec"]["backoffLimit"] == local["backoffLimit"] * nnodes
    assert job["spec"].get("podReplacementPolicy", "Failed") == "Failed"  # never two pods of one index
    assert "ttlSecondsAfterFinished" not in job["spec"]


def exit_action(job: dict, code: int) -> str:
    """What the Job's podFailurePolicy does with the learner container exiting `code` (Count: the default)."""
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        on = rule.get("onExitCodes")
        if on and on["containerName"] == "learner" and (code in on["values"]) == (on["operator"] == "In"):
            return rule["action"]
    return "Count"


FAKE = "#!/bin/sh\nexit $EXIT\n"  # a `coevolve` whose ranks all exit $EXIT


@pytest.mark.parametrize(("node", "code", "stopping", "expected", "action"), [
    (0, 0, False, 0, "Succeeded"),  # the run is finished: the Job succeeds
    (0, 0, True, 143, "Count"),     # stopped (preStop's mark): retried, counted unless evicted
    (0, 1, False, 1, "Count"),      # a rank failed: torchrun stopped the group
    (0, 2, False, 2, "FailJob"),    # usage or configuration
    (1, 0, False, 75, "Ignore"),    # rank 0 ended the group: pod 0's exit decides
    (1, 0, True, 75, "Ignore"),
    (1, 1, False, 1, "Count"),
    (1, 2, False, 2, "FailJob"),
])
def test_the_wrapper_tells_finish_stop_and_failure_apart_on_each_pod(docs, tmp_path, node, code, stopping,
                                                                     expected, action):
    job, _, c = learner(docs)
    hook = c["lifecycle"]["preStop"]["exec"]["command"][2]
    command = c["command"]
    assert command[:2] == ["sh", "-c"] and "/tmp/stopping" in command[2] and '"/tmp/stopping"' in hook
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/coevolve").write_text(FAKE)
    (tmp_path / "bin/coevolve").chmod(0o755)
    if stopping:
        (tmp_path / "stopping").touch()
    script = command[2].replace("/tmp/stopping", str(tmp_path / "stopping"))
    env = container_env(c, docs, fields={COMPLETION_INDEX: str(node)})
    run = subprocess.run(["sh", "-c", script, *command[3:], *c["args"]], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "EXIT": str(code),
                              "LEARNER_NODE_RANK": env["LEARNER_NODE_RANK"]})
    assert run.returncode == expected, run.stderr
    assert (exit_action(job, run.returncode) if run.returncode else "Succeeded") == action
    if run.returncode == 0:
        assert job["spec"]["successPolicy"]["rules"][0]["succeededIndexes"] == str(node)


def test_the_ranks_train_with_deepspeed_zero3_from_the_mounted_config(docs):
    _, spec, c = learner(docs)
    path = container_env(c, docs)["LEARNER_DEEPSPEED_CONFIG"]
    mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    settings = json.loads(find(docs, "ConfigMap", volume["configMap"]["name"])["data"][path.rsplit("/", 1)[1]])
    assert settings["zero_optimization"]["stage"] == 3 and settings["bf16"] == {"enabled": True}
