"""Render the kustomize tree and read what its pods would run, as the kubelet would expand it."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import yaml

from coevolve.services.runtime.config import parts

ROOT = Path(__file__).resolve().parents[1]
KUBECTL = shutil.which("kubectl")
OVERLAYS = ["k8s/overlays/local", "k8s/overlays/production"]
JOBS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "k8s/jobs").iterdir() if p.is_dir())
TARGETS = OVERLAYS + JOBS
TOOLS = ROOT / ".venv-tools/bin"
# What a Secret key stands for when the tests expand arguments: the shape docs/deploy.md creates.
SECRET_STANDINS = {("coevolve-clickhouse", "url"): "http://coevolve:password@clickhouse:8123",
                   ("coevolve-clickhouse", "password"): "password", ("coevolve-llm", "api-key"): "key"}
# What a KafkaUser's Secret (Strimzi makes it, named after the user) stands for: its SCRAM password.
KAFKA_USER_STANDIN = "scram-password"
# What a downward-API field stands for: pod 0's (an indexed Job's completion index is 0 there).
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
FIELD_STANDINS = {COMPLETION_INDEX: "0"}


def render_text(target: str) -> str:
    """`kubectl kustomize` of a target; empty when kubectl is missing (the tests then skip)."""
    if KUBECTL is None:
        return ""
    return subprocess.run([KUBECTL, "kustomize", str(ROOT / target)], check=True, capture_output=True,
                          text=True).stdout


def render(target: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(render_text(target)) if doc]


def pods(docs: list[dict]):
    """(workload, pod spec) of every Deployment, StatefulSet and Job."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield doc, doc["spec"]["template"]["spec"]


def containers(docs: list[dict]):
    for doc, spec in pods(docs):
        for c in spec["containers"]:
            yield doc, c


def find(docs: list[dict], kind: str, name: str) -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def secret_standin(ref: dict, docs: list[dict]) -> str:
    """The stand-in of a secretKeyRef: a Secret docs/deploy.md creates, or a KafkaUser's of the render."""
    users = {d["metadata"]["name"] for d in docs if d["kind"] == "KafkaUser"}
    if ref["name"] in users and ref["key"] == "password":
        return KAFKA_USER_STANDIN
    return SECRET_STANDINS[(ref["name"], ref["key"])]


def container_env(container: dict, docs: list[dict], fields: dict[str, str] | None = None) -> dict[str, str]:
    """The container's environment: envFrom ConfigMaps of the render, then env (Secrets and downward-API
    fields as stand-ins; `fields` maps a fieldPath to its value in one pod)."""
    fields = {**FIELD_STANDINS, **(fields or {})}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        ref = var.get("valueFrom", {})
        if "secretKeyRef" in ref:
            env[var["name"]] = secret_standin(ref["secretKeyRef"], docs)
        elif "configMapKeyRef" in ref:
            key = ref["configMapKeyRef"]
            env[var["name"]] = find(docs, "ConfigMap", key["name"])["data"][key["key"]]
        elif "fieldRef" in ref:
            env[var["name"]] = fields[ref["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = var["value"]
    return env


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' `$(VAR)` expansion of command arguments; an unknown variable fails the test."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def program(container: dict) -> str | None:
    """The program a container of the CoEvolve image runs: `coevolve` (its entry point), alone or as the
    first word of an `sh -c` wrapper; None for another program."""
    if container["image"].split(":")[0] not in ("coevolve", "coevolve-gpu"):
        return None
    command = container.get("command", ["coevolve"])
    if command[:2] == ["sh", "-c"]:
        command = command[2].split()
    return command[0] if command[0] == "coevolve" else None


def coevolve_argv(container: dict, docs: list[dict]) -> list[str] | None:
    """The `coevolve` arguments a container runs, expanded; None for another program (vLLM's server,
    ClickHouse)."""
    args = expand(container.get("args", []), container_env(container, docs))
    return args if program(container) == "coevolve" else None


def command_of(argv: list[str]):
    """(path, click command, the rest of argv) of a `coevolve` argv; a missing command fails."""
    from typer.main import get_command

    from coevolve.services.cli import app

    path, command, rest = [], get_command(app), list(argv)
    while hasattr(command, "commands"):  # walk groups down to the leaf command
        assert rest, f"`coevolve {' '.join(path)}` needs a subcommand"
        name, rest = rest[0], rest[1:]
        assert name in command.commands, f"`coevolve {' '.join(path + [name])}` does not exist"
        path.append(name)
        command = command.commands[name]
    return path, command, rest


def loaded_configs(command) -> list[tuple[type, str]]:
    """(dataclass, prefix) of every `_load(Config, "prefix", ...)` a command's function makes, read off
    its source: the environment variables `PREFIX_FIELD` it reads are those dataclasses' fields."""
    function = inspect.unwrap(command.callback)
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    names = dict(function.__globals__)
    for node in ast.walk(tree):  # the function's own imports (the CLI imports lazily)
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            names.update({a.asname or a.name: getattr(module, a.name) for a in node.names})
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("_load", "load")
                and isinstance(node.args[0], ast.Name) and isinstance(node.args[1], ast.Constant)):
            found += [(kind, node.args[1].value) for kind in parts(names[node.args[0].id]).values()]
    return found


def with_mounted_files(env: dict[str, str], workload: dict, container: dict, docs: list[dict],
                       root: Path) -> dict[str, str]:
    """`env` with every path into one of the container's ConfigMap volumes pointing at a copy of that
    file under `root`, so that a config that reads the file at load can be loaded here."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    env = dict(env)
    for mount in container.get("volumeMounts", []):
        source = volumes[mount["name"]].get("configMap")
        if source is None:
            continue
        folder = root / mount["mountPath"].lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in find(docs, "ConfigMap", source["name"])["data"].items():
            (folder / name).write_text(text)
        env = {k: str(folder) + v[len(mount["mountPath"]):] if v.startswith(mount["mountPath"] + "/") else v
               for k, v in env.items()}
    return env
