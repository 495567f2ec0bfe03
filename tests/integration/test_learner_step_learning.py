"""The learner's real step path learns: rollouts through the transformers backend, GRPO, weight pushes.

A random-weight Llama with a byte-level tokenizer (259 tokens: a vocabulary small enough that a few
steps of samples touch every token) answers a one-turn toy environment. The toy reward is the share of
the 8 sampled tokens that are lowercase ASCII letters, about 26/259 for a random model. (With
`tiny-random`'s 49k-token vocabulary any fixed token set is sampled too rarely to learn in a few
steps.) Each
step is `StepRunner.run`: B = 4 tasks, K = 8 rollouts at temperature 1, group advantages, one engine
update, the new weights pushed into the rollout backend (policy version + 1). Before and after, the
backend's own policy is measured on 256 fresh rollouts.

Why chance cannot pass the margin: were training to do nothing, the 2 x 256 measured rewards would be
independent draws in [0, 1] around one mean p0. A rise of 0.4 needs the "after" mean 0.2 above p0 or
the "before" mean 0.2 below it; by Hoeffding each has probability at most exp(-2 * 256 * 0.2^2) =
exp(-20.5) < 1.3e-9, so chance passes with probability below 3e-9. (Seen here: 0.10 -> 0.83.)

The importance ratio: the backend reports log-probs of the tempered distribution it sampled from, so
at step 1, before any update, the engine's |log ratio| on the rollout tokens is ~0 at temperature 0.7;
an engine that divided by another temperature (the mismatch this guards against) sees a large one.
"""
import pytest
import torch

from coevolve.services.agent.backends import make_backend
from coevolve.services.agent.config import BackendConfig, EpisodeLimits, SamplingConfig
from coevolve.services.agent.episodes import run_episodes
from coevolve.services.envs.base import Task
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, SamplerConfig
from coevolve.services.learner.trainer.build import build_trainer
from coevolve.services.learner.loop.sampler import TaskPool
from bench.shapes import random_llama
from coevolve.services.learner.loop.step import StepRunner
from tests.agent_helpers import OneTurn, byte_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.heavy]

NEW = 8
TASKS = [Task(f"toy-{i}", (f"Write anything, number {i}.",), {}, ()) for i in range(8)]
LIMITS = EpisodeLimits(max_user_turns=1, max_context_tokens=512)
LETTERS = set()  # filled with the byte tokenizer's ids of a-z by the model fixture


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = byte_tokenizer()
    out = tmp_path_factory.mktemp("byte-llama")
    random_llama("tiny", seed=0, vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                 pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    LETTERS.update(tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz")))
    return str(out)


def letters(episode) -> float:
    generated = [t for t, bit in zip(episode.token_ids, episode.loss_mask) if bit]
    return sum(t in LETTERS for t in generated) / max(len(generated), 1)


def setup(model_dir: str, temperature: float, lr: float = 1e-2, lag: int = 0):
    backend = make_backend(BackendConfig(model=model_dir, backend="transformers", dtype="float32", seed=0,
                                         batch_size=64))
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    grpo = GRPOConfig(lr=lr, temperature=temperature, micro_batch_size=32, max_policy_lag=lag)
    engine = build_trainer(policy, grpo, backend.tokenizer.pad_token_id or 0)
    sampling = SamplingConfig(temperature=temperature, top_p=1.0, max_new_tokens=NEW, seed=0)
    cfg = LearnerConfig(batch_tasks=4, group_size=8)
    runner = StepRunner(cfg, grpo, TaskPool(TASKS, SamplerConfig(), rng_seed=0), backend, engine, sampling, LIMITS,
                        "run-learn", letters, env=OneTurn)
    return runner


def measure(runner, n: int = 256) -> float:
    episodes = run_episodes([TASKS[i % len(TASKS)] for i in range(n)], OneTurn, runner.backend, runner.sampling,
                            LIMITS)
    return sum(map(letters, episodes)) / n


def test_rollout_log_probs_match_the_policy_before_the_first_update(model_dir):
    runner = setup(model_dir, temperature=0.7)
    batch = runner.sequences(runner.gather(1).kept)
    assert sum(s.loss_tokens for s in batch) > 4 * 8  # at least one token per rollout, most have 8
    mismatched = build_trainer(runner.trainer.model, GRPOConfig(lr=1e-9, temperature=1.0))
    assert mismatched.update(batch)["abs_log_ratio"] > 0.05
    metrics = runner.trainer.update(batch)
    assert metrics["abs_log_ratio"] < 1e-3 and metrics["clip_fraction"] == 0.0


@pytest.mark.parametrize("lag", [0, 1])
def test_real_learner_steps_raise_the_toy_reward_well_beyond_chance(model_dir, lag):
    """With lag 1 the rollouts of step s+1 are sampled while step s trains (the decoupled loss corrects
    for it); every trajectory trained on is at most one version behind."""
    runner = setup(model_dir, temperature=1.0, lag=lag)
    before = measure(runner)
    rewards, lags = [], []
    try:
        for step in range(1, 11):
            result = runner.run(step)
            assert result.trained and result.record.policy_version == step == runner.backend.version
            rewards.append(result.record.train_reward)
            lags.append(result.record.staleness_max)
    finally:
        runner.close()
    after = measure(runner)
    assert before < 0.2, before
    assert after >= before + 0.4, (before, after, rewards)
    assert max(lags) <= lag and (lag == 0 or max(lags) == 1), lags


@pytest.fixture(scope="module")
def fleet_model_dir(tmp_path_factory):
    """The same kind of model with a head size vLLM's CPU attention takes (64), for a `vllm serve`."""
    tokenizer = byte_tokenizer()
    out = tmp_path_factory.mktemp("byte-llama-64")
    random_llama("tiny", seed=0, vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, bos_token_id=None,
                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    LETTERS.update(tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz")))
    return str(out)


@pytest.mark.timeout(900)
def test_steps_on_the_rollout_fleet_with_lag_1_raise_the_toy_reward(fleet_model_dir, tmp_path):
    """The same learning, its rollouts on a `vllm serve` process: every update pushed through vLLM's
    weight-transfer API (gloo), the next step's rollouts generated on the server while a step trains."""
    from transformers import AutoModelForCausalLM

    from coevolve.services.fleet.backend import FleetBackend
    from coevolve.services.fleet.config import FleetConfig
    from coevolve.services.fleet.servers import LocalServers

    config = BackendConfig(model=fleet_model_dir, backend="vllm-server", dtype="float32", max_model_len=512,
                           kv_cache_gib=1.0)
    fleet = FleetConfig(servers=1)
    with LocalServers(fleet_model_dir, config, fleet, tmp_path, name="byte-llama") as servers:
        backend = FleetBackend(servers.urls, fleet_model_dir, config, fleet, model_name="byte-llama", run_id="r")
        policy = AutoModelForCausalLM.from_pretrained(fleet_model_dir, dtype=torch.float32)
        grpo = GRPOConfig(lr=1e-2, temperature=1.0, micro_batch_size=32, max_policy_lag=1)
        engine = build_trainer(policy, grpo, backend.tokenizer.pad_token_id or 0)
        sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=NEW, seed=0)
        runner = StepRunner(LearnerConfig(batch_tasks=4, group_size=8, steps=10), grpo,
                            TaskPool(TASKS, SamplerConfig(), rng_seed=0), backend, engine, sampling, LIMITS,
                            "run-fleet-learn", letters, env=OneTurn)
        try:
            before = measure(runner)
            lags = []
            for step in range(1, 11):
                result = runner.run(step)
                assert result.trained and result.policy_update["servers"] == 1
                lags.append(result.record.staleness_max)
            after = measure(runner)
            versions = backend.server_versions
        finally:
            runner.close()
            backend.close()
    assert versions == {servers.urls[0]: 10} and max(lags) == 1 and lags[0] == 0
    assert before < 0.2, before
    assert after >= before + 0.4, (before, after)
