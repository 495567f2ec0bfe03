"""The learner with in-process vLLM rollouts: tempered log-probs match the policy, and pushes take effect.

`tiny-random` in float32 through vLLM (its own engine, so the weight pushes here touch no other test's
engine), sampling at temperature 0.7. Before any update the engine's |log ratio| on vLLM's rollout
tokens is ~0; after a GRPO update pushed into vLLM (version 1), fresh rollouts carry version 1 and
their log-probs match the *updated* policy, so the push really changed the weights vLLM samples from
(it did not, on CPU, for a head tied to the embeddings until `vllm_quirks` repacked it).
"""
import atexit

import pytest
import torch

pytest.importorskip("vllm")

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig  # noqa: E402
from coevolve.services.envs.base import Task  # noqa: E402
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, SamplerConfig  # noqa: E402
from coevolve.services.learner.trainer.build import build_trainer  # noqa: E402
from coevolve.services.learner.loop.sampler import TaskPool  # noqa: E402
from coevolve.services.learner.loop.step import StepRunner  # noqa: E402
from tests.agent_engines import TINY_RANDOM, backend_config, model_dir  # noqa: E402
from tests.agent_helpers import OneTurn  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TASKS = [Task(f"toy-{i}", (f"Say something, number {i}.",), {}, ()) for i in range(4)]


def first_token_odd(episode) -> float:
    generated = episode.token_ids[episode.prompt_len:episode.prompt_len + 1]
    return float(generated[0] % 2) if generated else 0.0


def test_vllm_rollouts_match_the_policy_before_and_after_a_pushed_update():
    from transformers import AutoModelForCausalLM

    from coevolve.services.agent.vllm_backend import VllmBackend

    backend = VllmBackend(str(model_dir(TINY_RANDOM)), backend_config(model=TINY_RANDOM, max_model_len=512),
                          model_name=TINY_RANDOM)
    atexit.register(backend.close)
    policy = AutoModelForCausalLM.from_pretrained(model_dir(TINY_RANDOM), dtype=torch.float32)
    grpo = GRPOConfig(lr=1e-2, temperature=0.7, micro_batch_size=16)
    engine = build_trainer(policy, grpo, backend.tokenizer.pad_token_id or 0)
    sampling = SamplingConfig(temperature=0.7, top_p=1.0, max_new_tokens=8)
    runner = StepRunner(LearnerConfig(batch_tasks=4, group_size=4), grpo, TaskPool(TASKS, SamplerConfig()), backend,
                        engine, sampling, EpisodeLimits(max_user_turns=1, max_context_tokens=512), "run-v",
                        first_token_odd, env=OneTurn)
    batch = runner.sequences(runner.gather(1).kept)
    update = runner.update_and_push(batch)
    assert update.trained and backend.version == 1
    assert update.metrics["abs_log_ratio"] < 0.01, update.metrics
    kept = runner.gather(2).kept
    assert all(e.policy_version == 1 for g in kept for e in g.episodes)
    after = runner.sequences(kept)
    probe = build_trainer(engine.model, GRPOConfig(lr=1e-9, temperature=0.7, micro_batch_size=16))
    assert probe.update(after)["abs_log_ratio"] < 0.01
    stale = build_trainer(AutoModelForCausalLM.from_pretrained(model_dir(TINY_RANDOM), dtype=torch.float32),
                         GRPOConfig(lr=1e-9, temperature=0.7, micro_batch_size=16))
    assert stale.update(after)["abs_log_ratio"] > 3 * probe.update(after)["abs_log_ratio"]
