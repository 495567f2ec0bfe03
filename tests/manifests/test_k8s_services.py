"""The loop's services on Kubernetes agree with the code: the explorer, validator and learner, their
variables, their LLM, the learner's GPU, DeepSpeed config, checkpoints and stop."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.runtime.config import load
from coevolve.services.runtime.service import Service
from tests.kustomize import (KUBECTL, OVERLAYS, coevolve_argv, command_of, container_env, containers,
                             find, loaded_configs, program, render, with_mounted_files)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) is not installed")
LOOP = {("streams", "worker"), ("archiver",), ("explorer",), ("validator",), ("learner",)}
# Read by every Kafka client of a process (services/kafka/security.py), whatever its command loads.
KAFKA_SECURITY = {f.upper() for f in KafkaSecurity.__dataclass_fields__}


def kafka_client(configs) -> bool:
    """Whether a command talks to Kafka: one of its configs names the broker."""
    return any("kafka_bootstrap" in cls.__dataclass_fields__ for cls, _ in configs)


def services(docs):
    """(workload, container, path, argv, click command) of every container running a `coevolve` service."""
    for workload, c in containers(docs):
        argv = coevolve_argv(c, docs)
        if argv is not None:
            path, command, _ = command_of(argv)
            yield workload, c, tuple(path), argv, command


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def config(docs) -> dict:
    return find(docs, "ConfigMap", "coevolve-config")["data"]


@pytest.mark.parametrize("target", OVERLAYS)
def test_every_service_of_the_loop_is_deployed(target):
    docs = render(target)
    deployed = {path: workload["kind"] for workload, _, path, _, _ in services(docs)}
    assert set(deployed) >= LOOP
    assert deployed[("learner",)] == "Job"  # a run ends; the others serve until stopped
    assert {deployed[p] for p in LOOP - {("learner",)}} == {"Deployment"}


@pytest.mark.parametrize("target", OVERLAYS)
def test_every_object_lands_in_the_coevolve_namespace(target):
    """An object without a namespace would go to the kubeconfig's default one: the production HPA did."""
    docs = render(target)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"coevolve"}


@pytest.mark.parametrize("target", OVERLAYS)
def test_every_variable_a_service_gets_names_something_it_reads(target, tmp_path):
    """Each `PREFIX_FIELD` of a service's own prefix is a field of a dataclass its command loads with
    that prefix (a typo would be silently ignored), and every value loads; an explicit variable is
    such a field, a flag's envvar, the API-key variable its backend reads, or (for a Kafka client) a
    field of KafkaSecurity, which its clients load."""
    docs = render(target)
    for workload, c, path, argv, command in services(docs):
        name = workload["metadata"]["name"]
        configs = loaded_configs(command)
        if not configs:  # a tool (replay, archive import): its variables are its flags' envvars
            continue
        env = container_env(c, docs)
        files = with_mounted_files(env, workload, c, docs, tmp_path)
        loaded = [load(cls, prefix, environ=files) for cls, prefix in configs]
        fields = {f"{p}_{f}".upper() for (cls, p) in configs for f in cls.__dataclass_fields__}
        bare = {f.upper() for cls, _ in configs for f in cls.__dataclass_fields__}
        if kafka_client(configs):
            KafkaSecurity.from_environment(files)
            bare |= KAFKA_SECURITY
        prefixes = {p.upper() + "_" for _, p in configs}
        for key in env:
            if any(key.startswith(p) for p in prefixes):
                assert key in fields, f"{name}: {key} is no field of {[cls.__name__ for cls, _ in configs]}"
        keys = {cfg.api_key_env for cfg in loaded if hasattr(cfg, "api_key_env")}
        keys |= {p.envvar for p in command.params if isinstance(p.envvar, str)}
        for var in c.get("env", []):
            assert var["name"] in fields | bare | keys, f"{name}: {var['name']} is read by nothing"


@pytest.mark.parametrize("target", OVERLAYS)
def test_no_shared_key_sets_a_field_of_every_service_by_its_bare_name(target):
    """The layering reads `FIELD` after `SERVICE_FIELD`: a shared key named like a field (MODEL,
    STEPS) would set it in every service that has one. Only the broker address, and how to reach it
    (KafkaSecurity's protocol, mechanism, CA), are meant so; a user name or password is one service's."""
    docs = render(target)
    bare = {f.upper() for *_, command in services(docs) for cls, _ in loaded_configs(command)
            for f in cls.__dataclass_fields__}
    assert set(config(docs)) & bare == {"KAFKA_BOOTSTRAP"}
    assert not set(config(docs)) & {"KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"}


@pytest.mark.parametrize("target", OVERLAYS)
def test_the_explorer_and_validator_ask_the_vllm_server_with_the_llm_key(target):
    from coevolve.services.agent.config import BackendConfig

    docs = render(target)
    port = find(docs, "Service", "vllm-server")["spec"]["ports"][0]["port"]
    for workload, c in containers(docs):
        labels, argv = workload["spec"]["template"]["metadata"]["labels"], coevolve_argv(c, docs) or [""]
        if argv[0] not in ("explorer", "validator"):
            assert "coevolve.io/llm-client" not in labels, workload["metadata"]["name"]
            continue
        backend = load(BackendConfig, argv[0], {"model": flag(argv, "--model"), "backend": flag(argv, "--backend"),
                                                "base_url": flag(argv, "--base-url")}, environ=container_env(c, docs))
        assert (backend.backend, backend.base_url) == ("openai", f"http://vllm-server:{port}/v1")
        assert backend.model == config(docs)["LLM_MODEL"]  # the name the server serves it under
        key = next(v for v in c["env"] if v["name"] == backend.api_key_env)
        assert key["valueFrom"] == {"secretKeyRef": {"name": "coevolve-llm", "key": "api-key"}}
        assert labels["coevolve.io/llm-client"] == "true" and labels["coevolve.io/kafka-client"] == "true"


@pytest.mark.parametrize("target", OVERLAYS)
def test_monitoring_may_scrape_every_service_and_nothing_else(target):
    docs = render(target)
    scrape = find(docs, "NetworkPolicy", "metrics-scrape")["spec"]
    admitted = {p["port"] for rule in scrape["ingress"] for p in rule["ports"]}
    for workload, c in containers(docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        ports = {p["containerPort"] for p in c.get("ports", []) if p["name"] == "metrics"}
        assert (labels.get("coevolve.io/metrics") == "true") == bool(ports), workload["metadata"]["name"]
        assert ports <= admitted, workload["metadata"]["name"]


@pytest.mark.parametrize("target", OVERLAYS)
def test_liveness_outlasts_the_longest_poll_of_the_explorer(target):
    """One poll of the explorer's loop explores a whole period, and /healthz fails after `stale_s`
    without a poll: a restart mid-period would explore it again, and again."""
    docs = render(target)
    explorer = find(docs, "Deployment", "explorer")["spec"]["template"]["spec"]["containers"][0]
    probe = explorer["livenessProbe"]
    budget = float(config(docs)["EXPLORER_MAX_SECONDS_PER_PERIOD"])
    assert 0 < budget and probe["periodSeconds"] * probe["failureThreshold"] >= budget + Service.stale_s + 120


@pytest.mark.parametrize("target", OVERLAYS)
def test_the_explorer_and_validator_run_alone_in_their_groups(target):
    """One replica, replaced (never rolled) so two never share the group: the explorer needs every
    StepCompleted (one partition), and the validator's novelty index is its own."""
    docs = render(target)
    for name in ("explorer", "validator"):
        spec = find(docs, "Deployment", name)["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}


def learner(docs):
    job = find(docs, "Job", "learner")
    spec = job["spec"]["template"]["spec"]
    return job, spec, spec["containers"][0]


@pytest.mark.parametrize("target", OVERLAYS)
def test_the_learner_resumes_from_its_checkpoint_volume_on_every_start(target):
    docs = render(target)
    job, spec, c = learner(docs)
    argv = coevolve_argv(c, docs)
    assert argv[0] == "learner" and "--resume" in argv
    workdir = flag(argv, "--workdir")
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == workdir)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == "learner" and not mount.get("readOnly")
    # One pod at a time (production: one gang of pods, test_k8s_ranks.py, which share the volume),
    # replaced only once gone; a config error (exit 2) is not retried.
    pods = job["spec"].get("parallelism", 1)
    assert pods == job["spec"].get("completions", 1) and spec["restartPolicy"] == "Never"
    access = find(docs, "PersistentVolumeClaim", "learner")["spec"]["accessModes"]
    assert access == (["ReadWriteOnce"] if pods == 1 else ["ReadWriteMany"])
    assert pods == 1 or job["spec"]["completionMode"] == "Indexed"
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "learner", "operator": "In", "values": [2]}} in rules
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    assert "ttlSecondsAfterFinished" not in job["spec"]  # a re-apply must not start the run again


def test_the_local_learner_trains_tiny_random_with_plain_torch_on_cpu():
    docs = render("k8s/overlays/local")
    _, spec, c = learner(docs)
    env = container_env(c, docs)
    assert program(c) == "coevolve" and "nvidia.com/gpu" not in c["resources"]["limits"]
    assert env["LEARNER_MODEL"] == "tiny-random" and not env.get("LEARNER_DEEPSPEED_CONFIG")


def test_the_production_learner_trains_with_deepspeed_zero3_on_the_gpu_image(tmp_path):
    """`coevolve learner` itself, no launcher before it (it starts torchrun for its ranks: test_k8s_ranks.py),
    with DeepSpeed ZeRO-3 in bf16 from the mounted config."""
    from coevolve.services.learner.config import GRPOConfig

    docs = render("k8s/overlays/production")
    _, spec, c = learner(docs)
    assert program(c) == "coevolve" and coevolve_argv(c, docs)[0] == "learner"
    assert c["image"].startswith("coevolve-gpu:")
    # The DeepSpeed config is the ConfigMap's file, mounted where LEARNER_DEEPSPEED_CONFIG points.
    env = container_env(c, docs)
    path = env["LEARNER_DEEPSPEED_CONFIG"]
    mount = next(m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    text = find(docs, "ConfigMap", volume["configMap"]["name"])["data"][os.path.relpath(path, mount["mountPath"])]
    (tmp_path / "ds.json").write_text(text)
    grpo = load(GRPOConfig, "learner", environ={**env, "LEARNER_DEEPSPEED_CONFIG": str(tmp_path / "ds.json")})
    settings = json.loads(text)
    assert grpo.deepspeed_config and settings["zero_optimization"]["stage"] == 3 and settings["bf16"]["enabled"]
    # Its base model is a directory of the models PVC, never a download.
    assert env["LEARNER_MODEL"].startswith("/models/")
    models = next(m for m in c["volumeMounts"] if m["mountPath"] == "/models")
    assert models["readOnly"] and next(v for v in spec["volumes"] if v["name"] == models["name"])[
        "persistentVolumeClaim"]["claimName"] == "models"


FAKE_LEARNER = """#!{python}
# Stands in for the `coevolve` console script (same argv shape: python .../coevolve learner ...).
import os, signal, sys, time
def stop(*_):
    time.sleep(2)  # the checkpoint of the last completed step
    open(os.environ["MARK"], "w").write("checkpointed " + os.environ.get("RANK", "-"))
    sys.exit(0)  # as the learner: a stop exits 0, like the end of the run
signal.signal(signal.SIGTERM, stop)
open(os.environ["MARK"] + ".started", "w").write(" ".join(sys.argv[1:]))
time.sleep(float(os.environ["RUN_SECONDS"]))  # the run; it ends here when nothing stops it
"""
# In the namespace's PID 1 (as the pod's pause container would be), start the container's command,
# wait for the learner, then run the preStop hook as the kubelet would (or not), and report both.
DRIVER = ('"$@" & CONTAINER=$!; while [ ! -e "$MARK.started" ]; do sleep 0.2; done; '
          'if [ -n "$HOOK" ]; then python -c "$HOOK"; echo hook=$?; fi; wait $CONTAINER; echo container=$?')


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is not installed")
@pytest.mark.parametrize("target", OVERLAYS)
@pytest.mark.parametrize("stopped", [True, False], ids=["stopped", "run-ends"])
def test_a_stopped_learner_checkpoints_and_is_retried_a_finished_one_completes(target, stopped, tmp_path):
    """The container's command and preStop hook, in a PID namespace of their own as in a pod (production's
    as on its pod 0): the hook signals the learner alone and waits for it, and the container exits 143
    (the Job retries it) after a stop, 0 (the Job is done) after the run."""
    docs = render(target)
    _, _, c = learner(docs)
    # The hook and the wrapper use /tmp (an emptyDir in the pod): a private one here, bound over /tmp
    # inside the namespace, which holds the stand-in too.
    pod_tmp = tmp_path / "pod-tmp"
    (pod_tmp / "bin").mkdir(parents=True)
    (pod_tmp / "bin/coevolve").write_text(FAKE_LEARNER.format(python=sys.executable))
    (pod_tmp / "bin/coevolve").chmod(0o755)
    hook = c["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python", "-c"]
    # A checkout under /tmp: its Python environment is bound back in at its own path inside the pod's /tmp.
    keep = ""
    if Path(sys.prefix).is_relative_to("/tmp"):
        inside = pod_tmp / Path(sys.prefix).relative_to("/tmp")
        inside.mkdir(parents=True)
        keep = f"mount --bind {Path(sys.prefix).resolve()} {inside} && "
    script = f"{keep}mount --rbind {pod_tmp} /tmp && " + DRIVER
    env = {"PATH": f"/tmp/bin:{os.path.dirname(sys.executable)}:/usr/bin:/bin", "MARK": "/tmp/mark",
           "HOOK": hook[2] if stopped else "", "RUN_SECONDS": "300" if stopped else "3", "HOME": "/tmp"}
    probe = subprocess.run(["unshare", "-rpfm", "--mount-proc", "mount", "--bind", str(pod_tmp), "/tmp"],
                           capture_output=True)
    if probe.returncode:
        pytest.skip(f"no unprivileged PID and mount namespaces here: {probe.stderr.decode().strip()}")
    run = subprocess.run(["unshare", "-rpfm", "--mount-proc", "sh", "-c", script, "sh", *c["command"], *c["args"]],
                         env=env, capture_output=True, text=True, timeout=240)
    output = run.stdout + run.stderr[-3000:]
    assert run.returncode == 0, output
    mark = pod_tmp / "mark"
    assert (pod_tmp / "stopping").exists() == stopped
    assert (pod_tmp / "mark.started").read_text().split() == coevolve_argv(c, docs)
    if stopped:
        assert "hook=0" in run.stdout and "container=143" in run.stdout, output
        assert mark.exists(), "the hook never signalled the learner"
        assert mark.read_text() == "checkpointed -"  # SIGTERM, and time to checkpoint
    else:
        assert "container=0" in run.stdout and not mark.exists(), output
