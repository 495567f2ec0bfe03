"""`coevolve learner --backend vllm-server` against a real `vllm serve` (tiny-random): a server that dies
mid-run fails the step with a message, nothing of it published; a resume on a new server continues."""
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from coevolve.services.fleet.config import FleetConfig
from coevolve.services.fleet.servers import LocalServers
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.topics import POLICY, STEPS, TRAJECTORIES
from coevolve.services.learner.loop.checkpoint import latest_checkpoint
from coevolve.services.runtime.ports import free_port
from tests.agent_engines import TINY_RANDOM, backend_config, model_dir

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.heavy]
B, K = 2, 2


def read_topic(bootstrap: str, topic: str) -> list[dict]:
    consumer = EventConsumer(bootstrap, [topic])
    try:
        return [d.event for d in consumer.drain(idle_s=1.5)]
    finally:
        consumer.close()


def servers(folder: Path) -> LocalServers:
    config = backend_config(model=TINY_RANDOM, backend="vllm-server", kv_cache_gib=1.0, max_model_len=8192)
    return LocalServers(str(model_dir(TINY_RANDOM)), config, FleetConfig(servers=1), folder).start()


def learner(bootstrap: str, workdir: Path, url: str, steps: int, *extra: str) -> list[str]:
    return [str(Path(sys.executable).with_name("coevolve")), "learner", "--bootstrap", bootstrap, "--workdir",
            str(workdir), "--model", TINY_RANDOM, "--backend", "vllm-server", "--max-new-tokens", "8",
            "--steps", str(steps), "--run-id", "run-fleet", *extra]


@pytest.mark.timeout(900)
def test_a_dead_server_fails_the_step_clearly_and_a_resume_continues_on_a_new_one(bootstrap, tmp_path):
    env = {**os.environ, "LEARNER_BATCH_TASKS": str(B), "LEARNER_GROUP_SIZE": str(K), "LEARNER_SEED_TASKS": "3",
           "LEARNER_MAX_USER_TURNS": "1", "LEARNER_MAX_CONTEXT_TOKENS": "6000", "LEARNER_DTYPE": "float32",
           "LEARNER_MAX_POLICY_LAG": "1", "LEARNER_SERVER_TIMEOUT_S": "30"}
    first = servers(tmp_path / "servers-1")
    try:
        env["LEARNER_SERVER_URLS"] = first.urls[0]
        port = free_port()
        child = subprocess.Popen(learner(bootstrap, tmp_path / "learner", first.urls[0], 50, "--metrics-port",
                                         str(port)), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        consumer = EventConsumer(bootstrap, [STEPS.name])
        deadline = time.monotonic() + 300
        while not consumer.poll(0.5) and time.monotonic() < deadline:
            assert child.poll() is None, child.stdout.read()
        consumer.close()
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json()
        assert health["servers_live"] == 1 and list(health["servers"]) == first.urls
        first.kill(0)  # the only server dies while the learner rolls out and pushes
        out, _ = child.communicate(timeout=180)
    finally:
        first.stop()
    assert child.returncode != 0, out
    assert "learner.step_failed" in out and "--resume" in out, out[-3000:]
    published = {e["step"] for e in read_topic(bootstrap, STEPS.name)}
    done = latest_checkpoint(tmp_path / "learner").step
    assert published == set(range(1, done + 1)) and done >= 1  # the failed step published nothing

    second = servers(tmp_path / "servers-2")  # a new server (another address) serves the starting weights
    try:
        env["LEARNER_SERVER_URLS"] = second.urls[0]
        resumed = subprocess.run(learner(bootstrap, tmp_path / "learner", second.urls[0], done + 2, "--resume"),
                                 env=env, capture_output=True, text=True, timeout=600)
    finally:
        second.stop()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    steps = {e["step"]: e for e in read_topic(bootstrap, STEPS.name)}
    assert sorted(steps) == list(range(1, done + 3))
    trajectories = {t["event_id"]: t for t in read_topic(bootstrap, TRAJECTORIES.name)}.values()
    assert len(trajectories) == (done + 2) * B * K  # each step published once, never trained on twice
    versions = sorted({u["version"] for u in read_topic(bootstrap, POLICY.name)})
    assert versions == list(range(1, steps[done + 2]["policy_version"] + 1))
