"""DeepSpeed ZeRO on CPU (DS_ACCELERATOR=cpu, one process) trains like plain torch.

The first DeepSpeed start on a machine JIT-builds its shared-memory communication op (about a
minute here); later starts reuse ~/.cache/torch_extensions.
"""
import json

import pytest

from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.engine import TorchEngine, build_engine
from coevolve.services.learner.shapes import random_llama
from tests.integration.test_learner_engine import SMALL, make_batch, max_diff, weights

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_matches_plain_torch_over_several_steps(tmp_path, stage):
    ds_file = tmp_path / "ds.json"
    ds_file.write_text(json.dumps({"zero_optimization": {"stage": stage}}))
    common = dict(lr=1e-3, micro_batch_size=2, kl_beta=0.05, max_grad_norm=1.0)
    plain = TorchEngine(random_llama("tiny", seed=0, **SMALL), GRPOConfig(**common))
    ds = build_engine(random_llama("tiny", seed=0, **SMALL), GRPOConfig(**common, deepspeed_config=str(ds_file)))
    assert type(ds).__name__ == "DeepSpeedEngine"
    assert ds.ds.zero_optimization_stage() == stage
    for step in range(4):
        batch = make_batch(seed=step)
        a, b = plain.train_step(batch), ds.train_step(batch)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5), step
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-2, abs=1e-6), step
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), step
    assert max_diff(weights(plain), weights(ds)) < 1e-4
    assert set(ds.state_dict()) == set(plain.state_dict())


def test_an_optimizer_section_in_the_json_takes_the_learners_lr(tmp_path):
    ds_file = tmp_path / "ds.json"
    ds_file.write_text(json.dumps({"zero_optimization": {"stage": 1},
                                   "optimizer": {"type": "AdamW", "params": {"lr": 0.5, "torch_adam": True}}}))
    ds = build_engine(random_llama("tiny", seed=0, **SMALL),
                      GRPOConfig(lr=1e-3, micro_batch_size=4, deepspeed_config=str(ds_file)))
    assert ds.optimizer.param_groups[0]["lr"] == 1e-3
    plain = TorchEngine(random_llama("tiny", seed=0, **SMALL), GRPOConfig(lr=1e-3, micro_batch_size=4))
    a, b = plain.train_step(make_batch()), ds.train_step(make_batch())
    assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
    assert max_diff(weights(plain), weights(ds)) < 1e-4
