"""DeepSpeed ZeRO on CPU (DS_ACCELERATOR=cpu, one process) trains like plain torch and resumes from its
checkpoints.

Each case runs in a child process (`deepspeed_child.py`), which trains both engines on the same
batches and prints their metrics. The first DeepSpeed start on a machine JIT-builds its shared-memory
communication op (about a minute here); later starts reuse ~/.cache/torch_extensions.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")


def train_both(tmp_path, ds_config: dict, steps=4, micro_batch=2, kl_beta=0.05) -> dict:
    ds_file = tmp_path / "ds.json"
    ds_file.write_text(json.dumps(ds_config))
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    out = subprocess.run([sys.executable, "-m", "tests.integration.deepspeed_child", str(ds_file), str(steps),
                          str(micro_batch), str(kl_beta)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=540)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_matches_plain_torch_over_several_steps(tmp_path, stage):
    run = train_both(tmp_path, {"zero_optimization": {"stage": stage}})
    assert run["trainer"] == "DeepSpeedTrainer" and run["stage"] == stage
    for step, (a, b) in enumerate(zip(run["torch"], run["deepspeed"])):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-5), step
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-2, abs=1e-6), step
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), step
    assert run["torch"][-1]["kl"] > 0  # the steps moved the policy away from the reference
    assert run["max_weight_diff"] < 1e-4 and run["same_names"]
    # a checkpoint restored into a fresh engine takes the same next step
    assert run["resumed_weight_diff"] < 1e-6


def test_an_optimizer_section_in_the_json_takes_the_learners_lr(tmp_path):
    # torch_adam: DeepSpeed's own Adam would JIT-build a fused op first (minutes on CPU).
    run = train_both(tmp_path, {"zero_optimization": {"stage": 1},
                                "optimizer": {"type": "AdamW", "params": {"lr": 0.5, "torch_adam": True}}},
                     steps=1, micro_batch=4, kl_beta=0.0)
    assert run["lr"] == 1e-3
    assert run["deepspeed"][0]["loss"] == pytest.approx(run["torch"][0]["loss"], abs=1e-5)
    assert run["max_weight_diff"] < 1e-4
