"""The production learner's rollout fleet: vLLM servers in dev mode that only the learner reaches, every
one of them named in the learner's settings, a transfer rendezvous at the learner, and the explorer
and validator kept on their own server."""
import json

import pytest

from tests.kustomize import KUBECTL, container_env, containers, expand, find, render

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) is not installed")
PRODUCTION = "k8s/overlays/production"
FLEET = "rollout-fleet"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # set by Kubernetes on an indexed Job's pods


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(PRODUCTION)


def config(docs) -> dict:
    return find(docs, "ConfigMap", "coevolve-config")["data"]


def pod_labels(docs, kind: str, name: str) -> dict:
    return find(docs, kind, name)["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels only; the tree uses no expressions) selects these labels."""
    assert "matchExpressions" not in selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def workloads(docs):
    """(kind, name, pod labels) of every workload of the render."""
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield d["kind"], d["metadata"]["name"], d["spec"]["template"]["metadata"]["labels"]


def indexed_pods(job: dict) -> list[dict]:
    """The labels of each pod of a Job: an indexed Job's carry their completion index too."""
    labels = job["spec"]["template"]["metadata"]["labels"]
    if job["spec"].get("completionMode") != "Indexed":
        return [labels]
    return [{**labels, INDEX_LABEL: str(i)} for i in range(job["spec"]["completions"])]


def policies(docs, labels: dict, direction: str):
    """The ingress or egress rules of every NetworkPolicy that applies to pods with these labels."""
    kind = direction.capitalize()
    for d in docs:
        spec = d["spec"] if d["kind"] == "NetworkPolicy" else None
        if spec and kind in spec["policyTypes"] and selects(spec["podSelector"], labels):
            yield from spec.get(direction, [])


def ports(rule: dict) -> set[int]:
    """The TCP ports a rule admits (port, or port to endPort); a rule without ports is refused here."""
    assert rule.get("ports"), rule
    assert all(p.get("protocol", "TCP") == "TCP" for p in rule["ports"])
    return {n for p in rule["ports"] for n in range(p["port"], p.get("endPort", p["port"]) + 1)}


def allowed(docs, direction: str, me: dict, peer: dict) -> set[int]:
    """The ports that the policies of pods labelled `me` open to or from (`direction`) pods labelled `peer`."""
    found: set[int] = set()
    for rule in policies(docs, me, direction):
        peers = rule.get("from" if direction == "ingress" else "to", [])
        if any("podSelector" in p and "namespaceSelector" not in p and selects(p["podSelector"], peer)
               for p in peers):
            found |= ports(rule)
    return found


def admitted(docs, source: dict, target: dict) -> set[int]:
    """The ports on which pods labelled `source` may open a connection to pods labelled `target`: the
    target's ingress and the source's egress must both allow it (default-deny covers both ways)."""
    return allowed(docs, "egress", source, target) & allowed(docs, "ingress", target, source)


def fleet_server(docs) -> tuple[dict, dict, list[str]]:
    """(StatefulSet, its vLLM container, its expanded arguments)."""
    fleet = find(docs, "StatefulSet", FLEET)
    c = fleet["spec"]["template"]["spec"]["containers"][0]
    return fleet, c, expand(c["args"], container_env(c, docs))


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_fleet_serves_the_learners_model_with_the_weight_transfer_routes(docs):
    fleet, c, args = fleet_server(docs)
    env, learner = container_env(c, docs), config(docs)
    assert c["command"] == ["vllm", "serve"] and c["image"].startswith("coevolve-gpu:")
    assert env.get("VLLM_SERVER_DEV_MODE") == "1"  # vLLM serves the weight routes only so
    assert json.loads(flag(args, "--weight-transfer-config")) == {"backend": learner["LEARNER_WEIGHT_TRANSFER"]}
    assert learner["LEARNER_WEIGHT_TRANSFER"] == "nccl"  # GPUs on both ends
    assert "--enforce-eager" in args
    assert flag(args, "--max-model-len") == learner["LEARNER_MAX_MODEL_LEN"]
    assert args[0] == flag(args, "--served-model-name") == learner["LEARNER_MODEL"]
    assert learner["LEARNER_MODEL"].startswith("/models/")
    spec = fleet["spec"]["template"]["spec"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/models")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] and volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert env["HF_HUB_OFFLINE"] == "1"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    assert (flag(args, "--host"), flag(args, "--port")) == ("0.0.0.0", str(port))
    probes = [c[p] for p in ("startupProbe", "livenessProbe", "readinessProbe")]
    assert all(p["httpGet"] == {"path": "/health", "port": "http"} for p in probes)


def test_the_fleet_samples_as_the_learners_own_engine_does(docs):
    """Log-probs after temperature (GRPO's old-policy side) and whitespace-free JSON, as in process."""
    from coevolve.services.agent.vllm_quirks import engine_arguments

    _, _, args = fleet_server(docs)
    engine = engine_arguments("m", dtype="auto", max_model_len=8192, enforce_eager=True, seed=0,
                              gpu_memory_utilization=0.3)
    assert flag(args, "--logprobs-mode") == engine["logprobs_mode"]
    structured = engine["structured_outputs_config"]
    assert json.loads(flag(args, "--structured-outputs-config")) == {
        "backend": structured.backend, "disable_any_whitespace": structured.disable_any_whitespace}


def test_the_fleet_shares_the_models_volume_on_the_vllm_servers_node(docs):
    """With `models` ReadWriteOnce, a pod mounting it elsewhere than the vLLM server's node would not
    start; otherwise every node may mount it."""
    models = find(docs, "PersistentVolumeClaim", "models")["spec"]["accessModes"]
    if models == ["ReadWriteOnce"]:
        terms = find(docs, "StatefulSet", FLEET)["spec"]["template"]["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        assert any(t["topologyKey"] == "kubernetes.io/hostname"
                   and selects(t["labelSelector"], pod_labels(docs, "Deployment", "vllm-server")) for t in terms)
    else:
        assert models in (["ReadWriteMany"], ["ReadOnlyMany"])


def test_the_fleet_keeps_a_server_through_a_drain(docs):
    fleet = find(docs, "StatefulSet", FLEET)
    labels = pod_labels(docs, "StatefulSet", FLEET)
    budgets = [d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget" and selects(d["spec"]["selector"], labels)]
    assert len(budgets) == 1 and budgets[0]["maxUnavailable"] < fleet["spec"]["replicas"]


def test_only_the_learner_reaches_the_fleet(docs):
    """Port 8000 carries the weight routes next to /v1, and a NetworkPolicy cannot tell them apart: the
    learner is the one workload admitted, on any port."""
    fleet = pod_labels(docs, "StatefulSet", FLEET)
    learner = pod_labels(docs, "Job", "learner")
    sources = [rule.get("from") for rule in policies(docs, fleet, "ingress")]
    assert sources and all(s == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "learner"}}}]
                           for s in sources)
    assert [name for _, name, labels in workloads(docs) if selects(sources[0][0]["podSelector"], labels)] == ["learner"]
    assert 8000 in admitted(docs, learner, fleet)
    for kind, name, labels in workloads(docs):
        if name not in ("learner", FLEET):
            assert not admitted(docs, labels, fleet), f"{kind} {name} reaches the fleet"


def test_the_learner_names_every_server_of_the_fleet(docs):
    fleet, c, _ = fleet_server(docs)
    learner = config(docs)
    service = find(docs, "Service", fleet["spec"]["serviceName"])["spec"]
    assert service["clusterIP"] == "None"  # headless: a DNS name per pod
    assert selects({"matchLabels": service["selector"]}, pod_labels(docs, "StatefulSet", FLEET))
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    assert service["ports"][0]["port"] == port
    urls = learner["LEARNER_SERVER_URLS"].split(",")
    replicas = fleet["spec"]["replicas"]
    assert learner["LEARNER_BACKEND"] == "vllm-server" and replicas == 2
    assert len(urls) == replicas
    assert urls == [f"http://{FLEET}-{i}.{fleet['spec']['serviceName']}:{port}" for i in range(replicas)]


def test_the_transfer_rendezvous_is_at_the_learner_one_port_per_server(docs):
    learner = config(docs)
    fleet = find(docs, "StatefulSet", FLEET)
    service = find(docs, "Service", learner["LEARNER_TRANSFER_HOST"])["spec"]
    # The name resolves to the learner's pod 0 itself (rank 0), whether or not it counts as ready.
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    chosen = [(d["metadata"]["name"], labels.get(INDEX_LABEL)) for d in docs
              if d["kind"] in ("Deployment", "StatefulSet", "Job")
              for labels in indexed_pods(d) if selects({"matchLabels": service["selector"]}, labels)]
    assert chosen == [("learner", "0")]
    first = int(learner["LEARNER_TRANSFER_PORT"])
    rendezvous = set(range(first, first + fleet["spec"]["replicas"]))
    assert {p["port"] for p in service["ports"]} == rendezvous
    fleet_labels, learner_labels = pod_labels(docs, "StatefulSet", FLEET), pod_labels(docs, "Job", "learner")
    ephemeral = set(range(32768, 61000))  # NCCL's and gloo's own listeners, both ways
    # Each side's policy opens exactly this much, not only their overlap: the servers' rendezvous
    # ports and the ephemeral range towards the learner; the API and the ephemeral range towards them.
    assert allowed(docs, "egress", fleet_labels, learner_labels) == rendezvous | ephemeral
    assert allowed(docs, "ingress", learner_labels, fleet_labels) == rendezvous | ephemeral
    assert allowed(docs, "egress", learner_labels, fleet_labels) == {8000} | ephemeral
    assert allowed(docs, "ingress", fleet_labels, learner_labels) == {8000} | ephemeral


def test_the_explorer_and_validator_keep_their_own_server_without_weight_routes(docs):
    server = find(docs, "Deployment", "vllm-server")["spec"]["template"]["spec"]["containers"][0]
    assert "VLLM_SERVER_DEV_MODE" not in container_env(server, docs)
    assert not any(a.startswith("--weight-transfer") for a in server["args"])
    port = find(docs, "Service", "vllm-server")["spec"]["ports"][0]["port"]
    clients = {}
    for workload, c in containers(docs):
        if workload["metadata"]["name"] in ("explorer", "validator"):
            args = expand(c["args"], container_env(c, docs))
            clients[workload["metadata"]["name"]] = flag(args, "--base-url")
    assert clients == {"explorer": f"http://vllm-server:{port}/v1", "validator": f"http://vllm-server:{port}/v1"}
    vllm = pod_labels(docs, "Deployment", "vllm-server")
    for name in clients:
        assert port in admitted(docs, pod_labels(docs, "Deployment", name), vllm), name


def test_the_learner_starts_once_every_server_of_the_fleet_answers(docs, tmp_path):
    """The learner's init container waits for each server in LEARNER_SERVER_URLS, then lets it start."""
    import http.server
    import socket
    import subprocess
    import sys
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    spec = find(docs, "Job", "learner")["spec"]["template"]["spec"]
    wait = next(c for c in spec["initContainers"] if c["name"] == "wait-for-fleet")
    assert wait["command"][:2] == ["python", "-c"]
    env = container_env(wait, docs)
    assert env["LEARNER_SERVER_URLS"] == config(docs)["LEARNER_SERVER_URLS"]
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as closed:  # a port nothing listens on: a server still loading
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}"
    up = [f"http://127.0.0.1:{s.server_address[1]}/" for s in servers]
    try:
        def run(urls: list[str], timeout: float):
            return subprocess.run([sys.executable, "-c", wait["command"][2]], capture_output=True, text=True,
                                  timeout=timeout, env={"LEARNER_SERVER_URLS": ",".join(urls), "NO_PROXY": "*"})

        assert run(up, timeout=30).returncode == 0
        with pytest.raises(subprocess.TimeoutExpired) as waited:
            run(up + [down], timeout=3)
        assert f"waiting for {down}" in (waited.value.stdout or b"").decode()
    finally:
        for server in servers:
            server.shutdown()
