"""Learner checkpoints round-trip the policy, optimizer and sampler state; runs are never overwritten."""
import re

import pytest
import torch

from coevolve.services.agent.config import BackendConfig
from coevolve.services.learner.loop import checkpoint as ckpt
from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, LearnerSettings
from coevolve.services.learner.trainer.build import build_trainer
from coevolve.services.learner.loop.resume import run_to_continue
from coevolve.services.learner.loop.service import Learner
from bench.shapes import random_llama
from coevolve.services.runtime.config import ConfigError


def engine(**fields):
    model = random_llama("tiny", seed=0, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    return build_trainer(model, GRPOConfig(lr=1e-2, **fields))


def train(e):
    seq = TrainSequence([1, 2, 3, 4], [0, 1, 1, 1], [0.0, -4.0, -4.0, -4.0], 1.0)
    e.update([seq, TrainSequence(seq.token_ids, seq.loss_mask, seq.logprobs, -1.0)])


@pytest.mark.parametrize("fields", [{}, {"lora_rank": 2, "lora_targets": "q_proj,v_proj"}], ids=["full", "lora"])
def test_a_checkpoint_restores_weights_optimizer_and_state(tmp_path, fields):
    a = engine(**fields)
    train(a)
    path = ckpt.save_checkpoint(tmp_path, a, step=3, run_id="run-x", policy_version=3,
                                sampler={"step": 3, "rng": [3, [1], None], "synthesized": []}, config={"k": 1})
    assert path == tmp_path / "checkpoints" / "step-000003"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000003"
    found = ckpt.latest_checkpoint(tmp_path)
    assert (found.step, found.run_id, found.policy_version, found.config) == (3, "run-x", 3, {"k": 1})
    b = engine(**fields)
    ckpt.restore_trainer(b, found)
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), name
    assert b.updates == 1
    train(a)
    train(b)  # the same Adam moments give the same next update
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(x, y, atol=1e-7), name


def test_a_partly_read_lora_export_leaves_gradients_on():
    names = engine(lora_rank=2, lora_targets="q_proj,v_proj").named_parameters()
    next(names)
    assert torch.is_grad_enabled()


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    e = engine()
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, e, step=step, run_id="r", policy_version=step, sampler={}, config={}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-000002", "step-000003"]
    assert ckpt.latest_checkpoint(tmp_path).step == 3


def test_no_checkpoint_means_a_fresh_run(tmp_path):
    assert ckpt.latest_checkpoint(tmp_path) is None
    run_id, found = run_to_continue(LearnerConfig(workdir=tmp_path, resume=True))
    assert found is None and run_id.startswith("run-")
    assert run_to_continue(LearnerConfig(workdir=tmp_path, run_id="mine"))[0] == "mine"


def test_an_existing_run_needs_resume_and_keeps_its_id(tmp_path):
    ckpt.save_checkpoint(tmp_path, engine(), step=1, run_id="run-a", policy_version=1, sampler={}, config={})
    with pytest.raises(ConfigError, match="--resume"):
        run_to_continue(LearnerConfig(workdir=tmp_path))
    assert run_to_continue(LearnerConfig(workdir=tmp_path, resume=True))[0] == "run-a"
    with pytest.raises(ConfigError, match="run-a"):
        run_to_continue(LearnerConfig(workdir=tmp_path, resume=True, run_id="run-b"))


def test_a_dangling_latest_pointer_is_a_clear_error(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-000009\n")
    with pytest.raises(FileNotFoundError, match="step-000009"):
        ckpt.latest_checkpoint(tmp_path)


def test_the_learner_refuses_an_http_backend(tmp_path):
    with pytest.raises(ConfigError, match="vllm, transformers or vllm-server"):
        Learner(LearnerSettings(LearnerConfig(workdir=tmp_path),
                                backend=BackendConfig(backend="openai", base_url="http://127.0.0.1:1/v1")))


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=-1), "steps=-1 must be >= 0"), (dict(batch_tasks=0), "batch_tasks=0 must be at least 1"),
    (dict(group_size=0), "group_size=0 must be at least 1"), (dict(eval_every=-1), "eval_every=-1 must be >= 0"),
    (dict(eval_split="dev"), "eval_split='dev': choose test, train or all"),
    (dict(keep_checkpoints=-1), "keep_checkpoints=-1 must be >= 0")])
def test_bad_learner_settings_fail_with_a_message(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        LearnerConfig(**kwargs)
