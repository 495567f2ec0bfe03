"""GRPO through the engine learns: a tiny random policy learns to emit one target token.

Each step samples K = 8 continuations of 8 tokens (temperature 1, fixed seed) for each of 8 random
prompts, rewards each continuation with the fraction of its tokens equal to TARGET, computes group
advantages per prompt, and takes one GRPO step (several micro-batches, KL on). Before and after, the
policy is measured on 256 fresh continuations.

Why the margin cannot be passed by chance: if training did nothing, the 2 x 256 measured rewards
would be independent draws in [0, 1] with the same mean p0. A difference of 0.4 needs the "after"
mean 0.2 above p0 or the "before" mean 0.2 below it; by Hoeffding each has probability at most
exp(-2 * 256 * 0.2^2) = exp(-20.5) < 1.3e-9, so chance passes with probability below 3e-9. With a
vocabulary of 32 the start is near 1/32 (0.03 here), and the test asks for a rise of at least 0.4.
"""
import pytest
import torch

from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.trainer.build import build_trainer
from coevolve.services.learner.trainer.grpo import group_advantages
from bench.shapes import random_llama

pytestmark = [pytest.mark.slow, pytest.mark.integration]

VOCAB, TARGET, PROMPT, NEW, TASKS, K = 32, 7, 4, 8, 8, 8


@torch.no_grad()
def sample(model, prompts: torch.Tensor, gen: torch.Generator):
    """Continue each prompt by NEW tokens at temperature 1; return ids and the sampled log-probs."""
    model.eval()
    ids, logprobs = prompts, []
    for _ in range(NEW):
        logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[:, -1].float(), -1)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen)
        logprobs.append(logp.gather(-1, nxt))
        ids = torch.cat([ids, nxt], dim=1)
    return ids, torch.cat(logprobs, dim=1)


def rewards_of(ids: torch.Tensor) -> torch.Tensor:
    return (ids[:, PROMPT:] == TARGET).float().mean(-1)


def mean_reward(model, gen, n=256) -> float:
    prompts = torch.randint(0, VOCAB, (n, PROMPT), generator=gen)
    return float(rewards_of(sample(model, prompts, gen)[0]).mean())


def grpo_batch(model, gen) -> tuple[list[TrainSequence], int]:
    prompts = torch.randint(0, VOCAB, (TASKS, PROMPT), generator=gen).repeat_interleave(K, dim=0)
    ids, logprobs = sample(model, prompts, gen)
    advantages, flat = group_advantages(rewards_of(ids), torch.arange(TASKS).repeat_interleave(K))
    mask = [0] * PROMPT + [1] * NEW
    return [TrainSequence(ids[i].tolist(), mask, [0.0] * PROMPT + logprobs[i].tolist(), float(advantages[i]))
            for i in range(len(ids))], flat


def test_grpo_raises_the_mean_reward_well_beyond_chance():
    model = random_llama("tiny", seed=0, vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2)
    engine = build_trainer(model, GRPOConfig(lr=3e-3, micro_batch_size=16, kl_beta=0.01))
    gen = torch.Generator().manual_seed(0)
    before = mean_reward(engine.model, gen)
    for _ in range(15):
        batch, _ = grpo_batch(engine.model, gen)
        metrics = engine.update(batch)
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    after = mean_reward(engine.model, gen)
    assert before < 0.15
    assert after >= before + 0.4, (before, after)
