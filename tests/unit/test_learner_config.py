"""The learner's training config: paper defaults, layering, and errors that say how to fix them."""
import json

import pytest

from coevolve.services.runtime.config import ConfigError, describe, load
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, RanksConfig, WarmupConfig, read_deepspeed_config


def test_defaults_are_the_papers_clip_range_and_token_mean():
    cfg = GRPOConfig()
    assert (cfg.clip_low, cfg.clip_high, cfg.loss_agg, cfg.lr) == (0.20, 0.28, "token-mean", 1e-6)
    assert cfg.kl_beta == 0.0 and cfg.lora_rank == 0 and cfg.deepspeed_config == ""
    assert all(text for _, _, text in describe(GRPOConfig))


def test_environment_layers_over_defaults():
    cfg = load(GRPOConfig, "learner", environ={"CLIP_HIGH": "0.3", "LEARNER_CLIP_HIGH": "0.25",
                                              "LOSS_AGG": "seq-mean-token-mean", "LEARNER_KL_BETA": "0.001"})
    assert (cfg.clip_high, cfg.loss_agg, cfg.kl_beta) == (0.25, "seq-mean-token-mean", 0.001)


@pytest.mark.parametrize("fields,match", [
    ({"lr": 0}, "lr must be positive"),
    ({"clip_low": 1.0}, "clip_low must be in"),
    ({"clip_high": 0}, "clip_high positive"),
    ({"kl_beta": -1}, "kl_beta must be >= 0"),
    ({"loss_agg": "sum"}, "use one of token-mean"),
    ({"reward": "dense"}, "use one of binary, partial, shaped"),
    ({"temperature": 0}, "temperature must be positive"),
    ({"micro_batch_size": 0}, "micro_batch_size must be at least 1"),
    ({"lora_rank": 4, "lora_targets": " , "}, "lora_targets is empty"),
    ({"deepspeed_config": "/nonexistent/ds.json"}, "is not a file"),
])
def test_invalid_settings_fail_at_start_with_a_fix(fields, match):
    with pytest.raises(ConfigError, match=match):
        GRPOConfig(**fields)


@pytest.mark.parametrize("fields", [{"warmup_steps": -1}, {"warmup_window": -2}, {"warmup_batch": 0},
                                    {"warmup_lr": 0.0}])
def test_warm_up_settings_are_checked_and_off_by_default(fields):
    assert WarmupConfig().warmup_steps == 0
    assert load(WarmupConfig, "learner", environ={"LEARNER_WARMUP_STEPS": "6"}).warmup_steps == 6
    with pytest.raises(ConfigError, match="warmup_steps and warmup_window must be >= 0"):
        WarmupConfig(**fields)


def test_deepspeed_config_is_read_and_checked(tmp_path):
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert GRPOConfig(deepspeed_config=str(good)).deepspeed_config == str(good)
    assert read_deepspeed_config(str(good))["zero_optimization"]["stage"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{stage: 1")
    with pytest.raises(ConfigError, match="not valid JSON"):
        GRPOConfig(deepspeed_config=str(bad))
    stage3 = tmp_path / "z3.json"
    stage3.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert GRPOConfig(deepspeed_config=str(stage3)).deepspeed_config == str(stage3)
    stage4 = tmp_path / "z4.json"
    stage4.write_text(json.dumps({"zero_optimization": {"stage": 4}}))
    with pytest.raises(ConfigError, match="use 0, 1, 2 or 3"):
        GRPOConfig(deepspeed_config=str(stage4))


def test_ranks_split_evenly_over_nodes_and_multi_node_needs_a_rendezvous():
    assert RanksConfig(world_size=16, nnodes=2, node_rank=1, rdzv_endpoint="learner-0:29400").per_node == 8
    with pytest.raises(ConfigError, match="multiple of nnodes"):
        RanksConfig(world_size=3, nnodes=2, rdzv_endpoint="h:1")
    with pytest.raises(ConfigError, match="needs rdzv_endpoint"):
        RanksConfig(world_size=4, nnodes=2)
    with pytest.raises(ConfigError, match="node_rank=2"):
        RanksConfig(world_size=4, nnodes=2, node_rank=2, rdzv_endpoint="h:1")


def test_lora_targets_are_split_on_commas():
    assert GRPOConfig(lora_rank=8, lora_targets="q_proj, v_proj").lora_target_modules == ["q_proj", "v_proj"]


def test_a_group_of_one_rollout_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="a group of one has advantage 0 and trains nothing"):
        LearnerConfig(group_size=1)
    assert LearnerConfig(group_size=2).group_size == 2
