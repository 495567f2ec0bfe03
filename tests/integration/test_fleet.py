"""The rollout fleet against two real `vllm serve` processes of tiny-random (float32), on loopback.

The tests share the servers and run in order: generation, an update from a perturbed transformers
model, failed and partial transfers, and last the destructive one that kills the servers.
"""
import json
import math
import threading
import time

import httpx
import pytest
import torch

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.generation import Request
from coevolve.services.fleet import transfer
from coevolve.services.fleet.backend import FleetBackend
from coevolve.services.fleet.client import FleetError, WeightTransferError
from coevolve.services.fleet.config import FleetConfig
from coevolve.services.fleet.servers import LocalServers
from coevolve.services.learner.trainer.grpo import token_logprobs
from tests.agent_engines import TINY_RANDOM, backend_config, model_dir

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.heavy]

TOLERANCE = 1e-4
"""Largest |server - learner| log-prob allowed after an update (float32 on both sides; 3e-6 measured)."""
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=8)
RUN = "run-fleet"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    config = backend_config(model=TINY_RANDOM, backend="vllm-server", kv_cache_gib=1.0, max_model_len=2048)
    fleet_config = FleetConfig(servers=2)
    with LocalServers(str(model_dir(TINY_RANDOM)), config, fleet_config, tmp_path_factory.mktemp("fleet")) as servers:
        backend = FleetBackend(servers.urls, str(model_dir(TINY_RANDOM)), config, fleet_config, TINY_RANDOM, run_id=RUN)
        backend.transfer_chunk_bytes = 256 * 1024  # several chunks per round, so a round can break half-way
        try:
            yield servers, backend
        finally:
            backend.close()


def perturbed_model(seed: int):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir(TINY_RANDOM)), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model.eval()


def prompt(backend: FleetBackend, text: str = "hello there") -> list[int]:
    return backend.template.conversation_ids([{"role": "user", "content": text}])


def weight_versions(urls) -> list[str]:
    return [httpx.get(f"{url}/weight_info").json()["weight_version"] for url in urls]


def server_prompt_logprobs(url: str, ids: list[int]) -> list[float]:
    body = {"model": TINY_RANDOM, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    steps = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["prompt_logprobs"]
    return [0.0] + [step[str(token)]["logprob"] for step, token in zip(steps[1:], ids[1:])]


def test_structured_output_and_refused_requests_fail_alone(fleet):
    _, backend = fleet
    schema = {"type": "object", "properties": {"tool": {"enum": ["cd", "ls"]}, "retry": {"type": "boolean"}},
              "required": ["tool", "retry"], "additionalProperties": False}
    requests = [Request(messages=[{"role": "user", "content": "JSON please"}], json_schema=schema)] * 2 + \
        [Request(prompt_ids=[1] * backend.max_model_len), Request(prompt_ids=[10 ** 9])]
    completions = backend.generate(requests, SamplingConfig(temperature=1.0, max_new_tokens=40))
    for completion in completions[:2]:
        value = json.loads(completion.text)
        assert value["tool"] in ("cd", "ls") and isinstance(value["retry"], bool)
    assert completions[2].finish_reason == "error" and "max_model_len" in completions[2].error
    # The server refuses an out-of-vocabulary token itself (HTTP 400): that request fails, the server stays up.
    assert completions[3].finish_reason == "error" and "HTTP 400" in completions[3].error, completions[3]
    assert len(backend.live_servers) == 2


@pytest.fixture(scope="module")
def updated(fleet):
    """Greedy output before, then version 1 from a perturbed model pushed to both servers."""
    _, backend = fleet
    ids = prompt(backend)
    before = backend.generate([Request(prompt_ids=ids)], GREEDY)[0]
    model = perturbed_model(seed=1)
    push = backend.update_weights(model.named_parameters(), version=1)
    return model, ids, before, push


def test_completions_are_token_in_token_out_and_spread_over_both_servers(fleet):
    servers, backend = fleet
    served = {s.url: s.served for s in backend.servers}
    requests = [Request(prompt_ids=prompt(backend, f"count to {n}")) for n in range(8)]
    completions = backend.generate(requests, SamplingConfig(temperature=1.0, max_new_tokens=8))
    assert all(c.error is None and c.token_ids for c in completions)
    assert all(len(c.logprobs) == len(c.token_ids) and all(math.isfinite(x) and x <= 0 for x in c.logprobs)
               for c in completions)
    assert all(c.policy_version == 0 and c.prompt_tokens == len(r.prompt_ids) for c, r in zip(completions, requests))
    per_server = [s.served - served[s.url] for s in backend.servers]
    assert sum(per_server) == 8 and min(per_server) >= 2, per_server
    # The ids are the server's own, not a re-tokenization of the text.
    ids = prompt(backend)
    (mine,) = backend.generate([Request(prompt_ids=ids)], GREEDY)
    body = {"model": TINY_RANDOM, "prompt": ids, "max_tokens": 8, "temperature": 0.0, "return_token_ids": True,
            "stop_token_ids": backend.template.stop_token_ids()}
    direct = httpx.post(f"{servers.urls[0]}/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert list(mine.token_ids) == direct["token_ids"]


def test_after_an_update_server_logprobs_equal_the_learners(fleet, updated):
    servers, backend = fleet
    model, ids, _, push = updated
    assert push.version == backend.version == 1
    assert weight_versions(servers.urls) == [f"{RUN}@1"] * 2
    assert backend.server_versions == {url: 1 for url in servers.urls}
    sequence = ids + [int(t) for t in torch.randint(0, model.config.vocab_size, (24,),
                                                     generator=torch.Generator().manual_seed(3))]
    with torch.no_grad():
        ours = token_logprobs(model(torch.tensor([sequence])).logits, torch.tensor([sequence]))[0]
    for url in servers.urls:
        theirs = torch.tensor(server_prompt_logprobs(url, sequence))
        assert (theirs - ours).abs().max().item() < TOLERANCE
    assert push.servers == 2 and push.servers_behind == 0
    assert push.bytes > 0
    assert backend.stats.extra["last_update_seconds"] > 0


def test_greedy_output_changes_with_the_update_and_follows_the_new_weights(fleet, updated):
    _, backend = fleet
    model, ids, before, _ = updated
    after = backend.generate([Request(prompt_ids=ids)] * 2, GREEDY)
    assert after[0].token_ids == after[1].token_ids and after[0].policy_version == 1
    assert after[0].token_ids != before.token_ids
    with torch.no_grad():
        reference = model.generate(torch.tensor([ids]), max_new_tokens=len(after[0].token_ids), do_sample=False)
    assert list(after[0].token_ids) == reference[0, len(ids):].tolist()


def test_an_explorer_on_the_openai_backend_chats_with_the_fleets_updated_policy(fleet, updated):
    """The explorer and validator can point at a fleet server (`--backend openai --base-url URL/v1`): its
    chat route answers from the weights the learner pushed."""
    from coevolve.services.agent.openai_backend import OpenAIBackend

    servers, backend = fleet
    model, _, _, _ = updated
    chat = OpenAIBackend(backend_config(model=TINY_RANDOM, backend="openai", base_url=f"{servers.urls[0]}/v1"))
    try:
        (reply,) = chat.generate([Request(messages=[{"role": "user", "content": "hello there"}])], GREEDY)
    finally:
        chat.close()
    ids = prompt(backend)  # the same conversation, rendered as the chat route renders it
    with torch.no_grad():
        reference = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY.max_new_tokens, do_sample=False)
    expected = backend.tokenizer.decode(reference[0, len(ids):], skip_special_tokens=True)
    assert reply.error is None and reply.text == expected[:len(reply.text)] and reply.text


def test_a_transfer_broken_half_way_keeps_the_old_weights_and_version(fleet, updated, monkeypatch):
    servers, backend = fleet
    ids = updated[1]
    old = backend.generate([Request(prompt_ids=ids)], GREEDY)[0]
    chunks: dict[int, int] = {}
    real = transfer._broadcast

    def breaks_at_the_third_chunk(group, tensor):
        chunks[id(group)] = chunks.get(id(group), 0) + 1
        if chunks[id(group)] == 3:
            raise ConnectionError("link lost")
        real(group, tensor)

    monkeypatch.setattr(transfer, "_broadcast", breaks_at_the_third_chunk)
    with pytest.raises(WeightTransferError, match="no server took version 2"):
        backend.update_weights(perturbed_model(seed=2).named_parameters())
    assert len(chunks) == 2 and backend.version == 1
    assert weight_versions(servers.urls) == [f"{RUN}@1"] * 2
    again = backend.generate([Request(prompt_ids=ids)], GREEDY)[0]
    assert again.token_ids == old.token_ids and again.policy_version == 1, again

    def fails_part_way():
        for i, pair in enumerate(perturbed_model(seed=2).named_parameters()):
            if i == 5:
                raise OSError("checkpoint shard unreadable")
            yield pair

    with pytest.raises(WeightTransferError):
        backend.update_weights(fails_part_way())
    assert backend.version == 1

    monkeypatch.setattr(transfer, "_broadcast", real)
    assert backend.update_weights(perturbed_model(seed=2).named_parameters()).version == 2
    assert weight_versions(servers.urls) == [f"{RUN}@2"] * 2


def test_a_server_left_behind_answers_with_its_own_version(fleet, updated, monkeypatch):
    servers, backend = fleet
    first: list[int] = []
    real = transfer._broadcast

    def breaks_the_first_server(group, tensor):
        if not first:
            first.append(id(group))
        if id(group) == first[0]:
            raise ConnectionError("link lost")
        real(group, tensor)

    monkeypatch.setattr(transfer, "_broadcast", breaks_the_first_server)
    push = backend.update_weights(perturbed_model(seed=3).named_parameters(), version=3)
    assert (push.version, push.servers, push.servers_behind) == (3, 1, 1)
    assert sorted(backend.server_versions.values()) == [2, 3]
    assert sorted(weight_versions(servers.urls)) == [f"{RUN}@2", f"{RUN}@3"]
    completions = backend.generate([Request(prompt_ids=prompt(backend, str(n))) for n in range(6)], GREEDY)
    assert {c.policy_version for c in completions} == {2, 3}

    monkeypatch.setattr(transfer, "_broadcast", real)
    assert backend.update_weights(perturbed_model(seed=4).named_parameters()).version == 4
    assert weight_versions(servers.urls) == [f"{RUN}@4"] * 2 and backend.stats.extra["servers_behind"] == 0


def test_a_server_killed_mid_batch_or_mid_push_is_marked_down_and_its_work_rerun_or_failed(fleet, monkeypatch):
    servers, backend = fleet
    requests = [Request(prompt_ids=prompt(backend, f"story {n}")) for n in range(16)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=200)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(out=backend.generate(requests, sampling)))
    worker.start()
    deadline = time.monotonic() + 30
    while backend.servers[0].in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    servers.kill(0)
    worker.join(timeout=300)
    completions = result["out"]
    assert len(completions) == 16 and all(c.error is None and c.token_ids for c in completions)
    assert backend.live_servers == [servers.urls[1]]
    real = transfer._broadcast

    def killed_in_the_round(group, tensor):  # the last server dies once it has entered the round
        servers.kill(1)
        real(group, tensor)

    monkeypatch.setattr(transfer, "_broadcast", killed_in_the_round)
    started = time.monotonic()
    with pytest.raises(WeightTransferError, match=f"no server took version {backend.version + 1}: .*Error"):
        backend.update_weights(perturbed_model(seed=5).named_parameters())
    assert time.monotonic() - started < 60  # gloo alone waits out its timeout for the dead peer (300 s)
    assert backend.live_servers == []
    with pytest.raises(FleetError, match="down"):
        backend.generate(requests[:2], GREEDY)
