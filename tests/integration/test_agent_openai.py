"""The OpenAI-compatible backend against a real vLLM server on loopback, serving tiny-random."""
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from coevolve.services.agent.generation import Request
from coevolve.services.agent.openai_backend import OpenAIBackend
from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.episodes import run_episodes
from coevolve.services.agent.structured import generate_json
from coevolve.services.envs.bfcl_data import get_task
from coevolve.services.runtime.ports import free_port
from tests.agent_engines import TINY_RANDOM, backend_config, model_dir

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.heavy]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` with tiny-random, stopped after the module."""
    port = free_port()
    log = (tmp_path_factory.mktemp("vllm-server") / "server.log").open("w")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir(TINY_RANDOM)),
         "--served-model-name", TINY_RANDOM, "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
         "--max-model-len", "6144", "--dtype", "float32",
         # A random model would fill JSON's optional whitespace until the token limit.
         "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}'], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, f"vLLM server exited; see {log.name}"
            assert time.monotonic() < deadline, f"vLLM server not ready in 300 s; see {log.name}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="module")
def backend(server):
    client = OpenAIBackend(backend_config(backend="openai", base_url=server, model=TINY_RANDOM, concurrency=4))
    yield client
    client.close()


def test_chat_requests_come_back_in_order_with_text_and_usage(backend):
    requests = [Request(messages=[{"role": "user", "content": f"count to {n}"}]) for n in range(6)]
    completions = backend.generate(requests, SamplingConfig(temperature=1.0, max_new_tokens=12, seed=5))
    assert len(completions) == 6 and all(c.error is None for c in completions)
    assert all(c.finish_reason in ("stop", "length") and c.prompt_tokens > 0 for c in completions)
    assert all(0 < c.completion_tokens <= 12 for c in completions)
    assert backend.stats.requests == 6 and backend.stats.errors == 0


def test_a_bfcl_episode_runs_through_the_endpoint_as_text(backend):
    (episode,) = run_episodes([get_task("multi_turn_base_5")], "bfcl", backend,
                              SamplingConfig(temperature=0.0, max_new_tokens=24))
    assert episode.done and episode.generations >= 1 and episode.token_ids == []
    assert episode.completion_tokens > 0


def test_structured_output_through_response_format_is_schema_valid(backend):
    schema = {"type": "object", "properties": {"tool": {"enum": ["cd", "ls"]}, "retry": {"type": "boolean"}},
              "required": ["tool", "retry"], "additionalProperties": False}
    out = generate_json(backend, [[{"role": "user", "content": "JSON please"}]] * 3, schema,
                        SamplingConfig(temperature=1.0, max_new_tokens=40, seed=1), retries=0)
    assert all(isinstance(v, dict) and v["tool"] in ("cd", "ls") and isinstance(v["retry"], bool) for v in out), out


def test_an_unreachable_endpoint_gives_failed_completions_not_exceptions():
    dead = OpenAIBackend(backend_config(backend="openai", base_url=f"http://127.0.0.1:{free_port()}/v1",
                                        model=TINY_RANDOM, max_retries=1, request_timeout_s=2.0))
    try:
        started = time.monotonic()
        completions = dead.generate([Request(messages=[{"role": "user", "content": "hi"}])] * 2,
                                    SamplingConfig(max_new_tokens=4))
    finally:
        dead.close()
    assert [c.finish_reason for c in completions] == ["error", "error"]
    assert all("Connection" in c.error for c in completions) and time.monotonic() - started < 30
