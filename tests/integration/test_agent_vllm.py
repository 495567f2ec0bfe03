"""The agent runtime with real models: SmolLM2 through in-process vLLM, checked against transformers."""
import math

import pytest

from coevolve.schemas.codec import default_registry
from coevolve.services.agent.generation import Request
from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import run_episodes
from coevolve.services.agent.structured import generate_json
from coevolve.services.envs import make_env
from coevolve.services.envs.bfcl_data import get_task
from tests.agent_engines import SMOLLM2, TINY_RANDOM, backend_config, hf_backend, vllm_backend

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.heavy]

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=32)


@pytest.fixture(scope="module")
def vllm():
    return vllm_backend(SMOLLM2)


@pytest.fixture(scope="module")
def bfcl_prompt(vllm):
    messages = make_env("bfcl").reset(get_task("multi_turn_base_3"))
    return messages, vllm.template.prompt_ids(messages)


def test_a_bfcl_episode_runs_to_its_end_and_records_a_valid_trajectory(vllm):
    task = get_task("multi_turn_base_3")
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=48, seed=11)
    limits = EpisodeLimits(max_user_turns=1, max_calls_per_turn=4, max_context_tokens=6144)
    episodes = run_episodes([task, task], "bfcl", vllm, sampling, limits)
    for i, episode in enumerate(episodes):
        assert episode.done and episode.generations >= 1 and episode.turns >= 1 and episode.errors == []
        texts = [m["content"] for m in episode.messages if m["role"] == "assistant"]
        segments = episode.generated_segments()
        assert [vllm.tokenizer.decode(s, skip_special_tokens=True) for s in segments] == texts
        sampled = [lp for lp, bit in zip(episode.logprobs, episode.loss_mask) if bit]
        assert len(sampled) == sum(map(len, segments)) and all(lp <= 0 and math.isfinite(lp) for lp in sampled)
        record = episode.to_trajectory_event("it-run", step=0, rollout_index=i, group_size=2)
        name, decoded = default_registry().decode(default_registry().encode("TrajectoryRecorded", record))
        assert name == "TrajectoryRecorded" and decoded["task_id"] == task.task_id
        assert decoded["completion_tokens"] == sum(episode.loss_mask) > 0
        assert decoded["policy_version"] == vllm.version
    assert episodes[0].token_ids != episodes[1].token_ids, "two seeded rollouts of one task should differ"


def test_greedy_vllm_and_transformers_agree_on_the_first_32_tokens(vllm, bfcl_prompt):
    _, ids = bfcl_prompt
    chat = vllm.template.conversation_ids([{"role": "user", "content": "Name three colours of the rainbow."}])
    hf = hf_backend(SMOLLM2)
    for prompt in (ids, chat):
        (a,) = vllm.generate([Request(prompt_ids=prompt)], GREEDY)
        (b,) = hf.generate([Request(prompt_ids=prompt)], GREEDY)
        assert len(a.token_ids) == len(b.token_ids) == 32
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 0.05


def test_update_weights_changes_greedy_output_and_bumps_the_version(vllm):
    import torch

    request = [Request(messages=[{"role": "user", "content": "List the files in my home folder."}])]
    (before,) = vllm.generate(request, GREEDY)
    original = {k: v.detach().clone() for k, v in hf_backend(SMOLLM2).net.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.02 * torch.randn(v.shape, generator=generator) if v.dim() == 2 else v
             for k, v in original.items()}
    start = vllm.version
    push = vllm.update_weights(noisy.items())
    assert push.version == start + 1 and push.servers == 1 and push.servers_behind == 0
    assert push.bytes == sum(v.numel() * v.element_size() for v in noisy.values())
    (after,) = vllm.generate(request, GREEDY)
    assert after.policy_version == start + 1 and after.token_ids != before.token_ids
    assert vllm.stats.extra["last_update_seconds"] > 0  # its speed is bench/bench_rollout.py's
    assert vllm.update_weights(original.items(), version=start + 2).version == start + 2
    (restored,) = vllm.generate(request, GREEDY)
    assert restored.token_ids == before.token_ids and restored.policy_version == start + 2


def test_structured_output_from_vllm_is_schema_valid_json(vllm):
    schema = {"type": "object", "properties": {"failure": {"type": "string", "maxLength": 60},
                                               "tool": {"enum": ["cd", "ls", "mv"]},
                                               "retry": {"type": "boolean"}},
              "required": ["failure", "tool", "retry"], "additionalProperties": False}
    conversations = [[{"role": "user", "content": "The agent called mv on a missing file. Describe the failure "
                                                  "as JSON."}]] * 2
    out = generate_json(vllm, conversations, schema, SamplingConfig(temperature=0.7, max_new_tokens=80, seed=3),
                        retries=0)
    for value in out:
        assert isinstance(value, dict), value
        assert set(value) == {"failure", "tool", "retry"} and value["tool"] in ("cd", "ls", "mv")


def test_a_local_backend_runs_on_the_cpu_threads_it_is_given():
    import torch

    from coevolve.services.agent.backends import make_backend

    before = torch.get_num_threads()
    try:
        make_backend(backend_config(model=TINY_RANDOM, backend="transformers", cpu_threads=1)).close()
        assert torch.get_num_threads() == 1
    finally:
        torch._C.set_num_threads(before)  # torch.set_num_threads is vLLM's no-op in this process
