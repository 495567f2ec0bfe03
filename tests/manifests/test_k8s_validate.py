"""Every rendered object is valid, and checkov finds nothing beyond the documented skips.

The validators live in their own venv, `.venv-tools` (`make test` creates it): checkov pins
dependencies that clash with the project's. Without it these tests skip and say how to get it.
"""
import json
import subprocess

import pytest
import yaml

from tests.kustomize import JOBS, KUBECTL, OVERLAYS, ROOT, TOOLS, render, render_text

pytestmark = [pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) is not installed"),
              pytest.mark.skipif(not (TOOLS / "checkov").exists() or not (TOOLS / "kubernetes-validate").exists(),
                                 reason="validators missing: run `make .venv-tools/.installed`")]
STRIMZI = "kafka.strimzi.io/"
SKIPS = yaml.safe_load((ROOT / "k8s/checkov-skips.yaml").read_text())
# jsonschema runs in the tools venv (it comes with kubernetes-validate); it reads the schema and the
# documents as JSON on stdin and prints each document's errors.
VALIDATE = """
import json, sys
from jsonschema import Draft202012Validator
job = json.load(sys.stdin)
validator = Draft202012Validator(job["schema"])
print(json.dumps([sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(d))
                  for d in job["docs"]]))
"""


def deployment(overlay: str, tmp_path) -> tuple:
    """An overlay with every Job template, as one file (the Jobs run in the overlay's namespace)."""
    text = "\n---\n".join(render_text(t) for t in [overlay, *JOBS])
    path = tmp_path / f"{overlay.split('/')[-1]}.yaml"
    path.write_text(text)
    return path, [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_validate_strictly_against_the_kubernetes_schemas(overlay, tmp_path):
    _, docs = deployment(overlay, tmp_path)
    core = [d for d in docs if not d["apiVersion"].startswith(STRIMZI)]
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump_all(core))
    run = subprocess.run([str(TOOLS / "kubernetes-validate"), "--strict", str(path)], capture_output=True, text=True)
    lines = (run.stdout + run.stderr).splitlines()
    assert run.returncode == 0, "\n".join(lines)
    assert sum(" passed for resource " in line for line in lines) == len(core)
    assert {d["kind"] for d in core} >= {"Deployment", "StatefulSet", "Job", "NetworkPolicy", "PodDisruptionBudget"}


def strimzi_errors(docs: list[dict]) -> list[list[str]]:
    schema = yaml.safe_load((ROOT / "tests/manifests/strimzi-v1beta2.schema.yaml").read_text())
    run = subprocess.run([str(TOOLS / "python"), "-c", VALIDATE], input=json.dumps({"schema": schema, "docs": docs}),
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_strimzi_resources_have_the_fields_strimzi_requires(overlay):
    docs = [d for d in render(overlay) if d["apiVersion"].startswith(STRIMZI)]
    users = {"KafkaUser"} if overlay.endswith("production") else set()  # local stays plaintext, without ACLs
    assert {d["kind"] for d in docs} == {"Kafka", "KafkaNodePool", "KafkaTopic"} | users
    assert strimzi_errors(docs) == [[] for _ in docs]
    cluster = next(d["metadata"]["name"] for d in docs if d["kind"] == "Kafka")
    assert {d["metadata"]["labels"]["strimzi.io/cluster"] for d in docs if d["kind"] != "Kafka"} == {cluster}


def test_the_strimzi_schema_rejects_what_strimzi_would():
    pool = next(d for d in render("k8s/overlays/local") if d["kind"] == "KafkaNodePool")
    topic = next(d for d in render("k8s/overlays/local") if d["kind"] == "KafkaTopic")
    no_roles = {**pool, "spec": {k: v for k, v in pool["spec"].items() if k != "roles"}}
    bad_role = {**pool, "spec": {**pool["spec"], "roles": ["broker", "zookeeper"]}}
    unlabelled = {**topic, "metadata": {"name": topic["metadata"]["name"], "labels": {"app": "coevolve"}}}
    typo = {**topic, "spec": {**topic["spec"], "partition": 3}}
    errors = strimzi_errors([no_roles, bad_role, unlabelled, typo])
    assert all(len(e) == 1 for e in errors), errors
    assert "'roles' is a required property" in errors[0][0] and "zookeeper" in errors[1][0]
    assert "strimzi.io/cluster" in errors[2][0] and "'partition' was unexpected" in errors[3][0]


def test_the_strimzi_schema_rejects_a_kafka_user_strimzi_would():
    user = next(d for d in render("k8s/overlays/production") if d["kind"] == "KafkaUser")
    rule = user["spec"]["authorization"]["acls"][0]

    def with_rule(**changes) -> dict:
        acls = [{**rule, **changes}]
        return {**user, "spec": {**user["spec"], "authorization": {"type": "simple", "acls": acls}}}

    errors = strimzi_errors([with_rule(operations=["Publish"]), with_rule(resource={"type": "topic"}),
                             with_rule(resource={"type": "cluster", "name": "coevolve"}),
                             with_rule(resource={**rule["resource"], "patternType": "regex"}),
                             {**user, "spec": {**user["spec"], "authentication": {"type": "plain"}}}])
    assert all(len(e) == 1 for e in errors), errors
    assert "'Publish'" in errors[0][0] and "'name' is a required property" in errors[1][0]
    assert "'regex'" in errors[3][0] and "'plain'" in errors[4][0]


def checkov(framework: str, path) -> dict:
    run = subprocess.run([str(TOOLS / "checkov"), "--framework", framework, "-f", str(path), "--output", "json",
                          "--compact", "--skip-download"], capture_output=True, text=True)
    assert run.returncode in (0, 1), run.stderr  # 1: some check failed; anything else: checkov itself failed
    report = json.loads(run.stdout)
    return report[0] if isinstance(report, list) else report


@pytest.mark.slow
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkov_fails_exactly_the_documented_skips(overlay, tmp_path):
    path, docs = deployment(overlay, tmp_path)
    report = checkov("kubernetes", path)
    failed = {c["check_id"] for c in report["results"]["failed_checks"]}
    skips = {**SKIPS["all"], **SKIPS.get(overlay.split("/")[-1], {})}
    assert failed == set(skips), f"new failures: {failed - set(skips)}; stale skips: {set(skips) - failed}"
    assert report["summary"]["passed"] > 300 and report["summary"]["resource_count"] >= len(docs) - 1


@pytest.mark.slow
def test_checkov_passes_the_dockerfile_with_its_one_inline_skip():
    report = checkov("dockerfile", ROOT / "Dockerfile")
    assert report["summary"]["failed"] == 0
    assert [c["check_id"] for c in report["results"]["skipped_checks"]] == ["CKV_DOCKER_2"]


def test_every_checkov_skip_is_explained_in_the_deploy_guide():
    guide = (ROOT / "docs/deploy.md").read_text()
    ids = {i for skips in SKIPS.values() for i in skips} | {"CKV_DOCKER_2"}
    assert all(i in guide for i in ids), [i for i in ids if i not in guide]
