"""The supervised warm-up: reference episodes through the real BFCL environment, cross-entropy on
tiny-random, and the warmed model cached by what shapes it."""
import itertools
import json

import pytest
from transformers import AutoTokenizer

from coevolve.services.agent.config import EpisodeLimits, default_home
from coevolve.services.agent.models import resolve_model
from coevolve.services.agent.templates import ChatTemplate
from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.learner.config import GRPOConfig, WarmupConfig
from coevolve.services.learner.loop.warmup import TURN_END, _batches, reference_examples, warm_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LIMITS = EpisodeLimits(max_user_turns=2, max_context_tokens=8192)


@pytest.fixture(scope="module")
def tiny() -> str:
    """tiny-random's directory in the machine's model cache; warmed copies go to each test's own home."""
    return str(resolve_model("tiny-random", default_home()))


@pytest.fixture(scope="module")
def tasks():
    by_category = [load_tasks([c], split="train") for c in ("multi_turn_base", "multi_turn_miss_param")]
    return [t for group in itertools.zip_longest(*by_category) for t in group if t is not None][:4]


def test_reference_episodes_hold_exactly_the_reference_calls_as_generated_tokens(tasks, tiny):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    examples, left_out = reference_examples(tasks, ChatTemplate(tokenizer), LIMITS)
    assert left_out == 0 and [e.task_id for e in examples] == [t.task_id for t in tasks]
    for task, example in zip(tasks, examples):
        generated = tokenizer.decode([i for i, m in zip(example.token_ids, example.loss_mask) if m])
        replies = [r for r in generated.split(tokenizer.eos_token) if r]
        calls = [f"[{', '.join(turn)}]" for turn in task.reference[:LIMITS.max_user_turns] if turn]
        assert [r for r in replies if r != TURN_END] == calls
        assert replies.count(TURN_END) == LIMITS.max_user_turns  # every played turn ends with a plain reply
        assert example.loss_mask[0] == 0 and sum(example.loss_mask) < len(example.token_ids) / 10


def test_batches_cover_every_example_before_repeating_and_are_seeded():
    batches = _batches(5, 2, 5, seed=3)
    flat = [i for b in batches for i in b]
    assert sorted(flat[:5]) == [0, 1, 2, 3, 4] and sorted(flat[5:10]) == [0, 1, 2, 3, 4]
    assert batches == _batches(5, 2, 5, seed=3) != _batches(5, 2, 5, seed=4)
    assert _batches(1, 4, 2, seed=0) == [[0], [0]]


def test_warm_up_lowers_the_loss_and_is_trained_once_per_setting(tasks, tiny, tmp_path):
    home = tmp_path / "home"
    warm, grpo = WarmupConfig(warmup_steps=6, warmup_lr=5e-3, warmup_batch=2), GRPOConfig()
    path = warm_model(tiny, home, warm, grpo, 0, tasks, LIMITS)
    report = json.loads((path / "warmup.json").read_text())
    assert len(report["losses"]) == 6 and report["examples"] == 4
    assert report["losses"][-1] < 0.8 * report["losses"][0]
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert warm_model(tiny, home, warm, grpo, 0, tasks, LIMITS) == path
    assert weights.stat().st_mtime_ns == stamp  # cached, not trained again
    other = warm_model(tiny, home, WarmupConfig(warmup_steps=1, warmup_lr=5e-3), grpo, 0, tasks[:2], LIMITS)
    assert other != path and json.loads((other / "warmup.json").read_text())["examples"] == 2
